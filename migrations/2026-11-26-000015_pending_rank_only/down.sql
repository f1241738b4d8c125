DROP INDEX ix_task_queue_pending_rank;
CREATE INDEX ix_task_queue_rank ON task_queue (scheduler_id, status, priority, created_at, task_id);
