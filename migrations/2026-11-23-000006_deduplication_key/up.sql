-- Cross-organisation de-duplication: sibling boefje tasks (the same boefje on the same object in
-- several organisations) share `data.deduplication_key`, and a boefje pop hands out the whole
-- group. The key is a key field like `input_ooi`: a column beside the payload, indexed over the
-- pending backlog, so a group's pending members are found without reading payloads.
ALTER TABLE tasks ADD COLUMN deduplication_key TEXT;
CREATE INDEX ix_tasks_pending_deduplication_key
    ON tasks (scheduler_id, deduplication_key, priority, created_at, id)
    WHERE status = 'pending' AND deduplication_key IS NOT NULL;
-- Waiting tasks written before this column existed may carry a key in their payload: clearing
-- `plugin_id` marks their key fields as missing, and the next heap rebuild fills all of them in
-- from the payload (the same backfill migration 4 relies on), on either backend.
UPDATE tasks SET plugin_id = NULL
    WHERE status IN ('pending', 'queued') AND scheduler_id = 'boefje'
    AND data LIKE '%"deduplication_key":"%';
