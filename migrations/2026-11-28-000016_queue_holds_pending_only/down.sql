-- Queued tasks get their `task_queue` rows back, copied from `tasks` as migration 11 did.
INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at, modified_at, hash,
        schedule_id, organisation, plugin_id, oci_image, input_ooi, deduplication_key)
    SELECT id, scheduler_id, status, priority, created_at, modified_at, hash, schedule_id,
        organisation, plugin_id, oci_image, input_ooi, deduplication_key
    FROM tasks WHERE status = 'queued';
