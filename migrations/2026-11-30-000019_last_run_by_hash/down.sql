CREATE INDEX ix_tasks_hash ON tasks (hash);
DROP INDEX ix_tasks_hash_created;
