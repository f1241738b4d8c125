-- The fields workers and the webapp select tasks by (see src/domain/keys.rs), held next to the
-- payload so the pending backlog can be searched by index: a worker whose filter matches only
-- pending tasks must find them without a scan. Filled by the broker on every write; rows written
-- before this migration are filled when an engine rebuilds its heap.
ALTER TABLE tasks ADD COLUMN plugin_id TEXT;
ALTER TABLE tasks ADD COLUMN oci_image TEXT;
ALTER TABLE tasks ADD COLUMN input_ooi TEXT;
-- Only pending rows are indexed (queued ones are indexed in memory), so pushes with room in the
-- heap and pops write none of these.
CREATE INDEX ix_tasks_pending_organisation ON tasks (scheduler_id, organisation, priority, created_at, id)
    WHERE status = 'pending';
CREATE INDEX ix_tasks_pending_plugin_id ON tasks (scheduler_id, plugin_id, priority, created_at, id)
    WHERE status = 'pending' AND plugin_id IS NOT NULL;
CREATE INDEX ix_tasks_pending_oci_image ON tasks (scheduler_id, oci_image, priority, created_at, id)
    WHERE status = 'pending' AND oci_image IS NOT NULL;
CREATE INDEX ix_tasks_pending_input_ooi ON tasks (scheduler_id, input_ooi, priority, created_at, id)
    WHERE status = 'pending' AND input_ooi IS NOT NULL;
-- Waiting rows whose key fields are not filled in (written before these columns existed, or by an
-- older version during a rolling deploy): a rebuild finds them here and fills them in. Rows the
-- broker writes have a plugin, so the index stays empty.
CREATE INDEX ix_tasks_keys_missing ON tasks (scheduler_id, id)
    WHERE plugin_id IS NULL AND status IN ('pending', 'queued');
