-- Fails on PostgreSQL while a pending row holds a reference longer than an index entry allows:
-- those tasks must leave the backlog (popped or cancelled) first.
DROP INDEX ix_task_queue_pending_input_ooi;
CREATE INDEX ix_task_queue_pending_input_ooi
    ON task_queue (scheduler_id, input_ooi, priority, created_at, task_id)
    WHERE status = 'pending' AND input_ooi IS NOT NULL;
