DROP INDEX ix_tasks_hash;
CREATE INDEX ix_tasks_finished ON tasks (modified_at)
    WHERE status IN ('completed', 'failed', 'cancelled');
CREATE INDEX ix_tasks_hash_finished ON tasks (hash, modified_at)
    WHERE status IN ('completed', 'failed');
CREATE INDEX ix_tasks_pending_deduplication_key
    ON tasks (scheduler_id, deduplication_key, priority, created_at, id)
    WHERE status = 'pending' AND deduplication_key IS NOT NULL;
CREATE INDEX ix_tasks_pending_input_ooi ON tasks (scheduler_id, input_ooi, priority, created_at, id)
    WHERE status = 'pending' AND input_ooi IS NOT NULL;
CREATE INDEX ix_tasks_pending_oci_image ON tasks (scheduler_id, oci_image, priority, created_at, id)
    WHERE status = 'pending' AND oci_image IS NOT NULL;
CREATE INDEX ix_tasks_pending_plugin_id ON tasks (scheduler_id, plugin_id, priority, created_at, id)
    WHERE status = 'pending' AND plugin_id IS NOT NULL;
CREATE INDEX ix_tasks_pending_organisation ON tasks (scheduler_id, organisation, priority, created_at, id)
    WHERE status = 'pending';
CREATE INDEX ix_tasks_keys_missing ON tasks (scheduler_id, id)
    WHERE plugin_id IS NULL AND status IN ('pending', 'queued');
CREATE INDEX ix_tasks_hash_waiting ON tasks (hash) WHERE status IN ('pending', 'queued');
CREATE INDEX ix_tasks_waiting ON tasks (scheduler_id, status, priority, created_at, id, hash)
    WHERE status IN ('pending', 'queued');
-- `tasks` kept every waiting task's status, priority and key fields up to date, so nothing of
-- the queue is lost when it goes.
DROP TABLE task_queue;
