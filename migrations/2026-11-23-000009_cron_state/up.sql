-- The cron tables' periodic entries keep their next run here, so a restart neither skips nor
-- repeats a run.
CREATE TABLE cron_state (
    component TEXT NOT NULL,
    entry TEXT NOT NULL,
    next_run_at TIMESTAMP NOT NULL,
    last_run_at TIMESTAMP,
    PRIMARY KEY (component, entry)
);
-- Finished tasks by age, for pruning them past their retention.
CREATE INDEX ix_tasks_finished ON tasks (modified_at)
    WHERE status IN ('completed', 'failed', 'cancelled');
