-- Why each planned task has its priority (`GET /tasks/{id}/explain`): the strategy, its inputs
-- and terms, as JSON. Deleted with the task.
CREATE TABLE task_scores (
    task_id TEXT PRIMARY KEY NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    explanation TEXT NOT NULL
);
-- The last finished run of the same work (a hash), which the scoring strategies read; written
-- only when a task finishes, never by a pop.
CREATE INDEX ix_tasks_hash_finished ON tasks (hash, modified_at)
    WHERE status IN ('completed', 'failed');
