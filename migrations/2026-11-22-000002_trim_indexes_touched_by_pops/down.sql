DROP INDEX ix_tasks_hash_waiting;
CREATE INDEX ix_tasks_hash ON tasks (hash);
CREATE INDEX ix_tasks_schedule_id ON tasks (schedule_id);
CREATE INDEX ix_tasks_modified_at ON tasks (modified_at);
