DROP INDEX ix_tasks_waiting;
CREATE INDEX ix_tasks_waiting ON tasks (scheduler_id, status, priority, created_at, id)
    WHERE status IN ('pending', 'queued');
