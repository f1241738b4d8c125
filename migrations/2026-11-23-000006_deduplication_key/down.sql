DROP INDEX ix_tasks_pending_deduplication_key;
ALTER TABLE tasks DROP COLUMN deduplication_key;
