-- The fire ledger: one row per due fire of a schedule (the deadline that came due) and what
-- became of it, so "did my weekly scan run?" has an answer. Rescheduling writes a fire's row in
-- the same transaction that moves its schedule on or disables it; a fire that waits (nothing
-- can vouch for its object yet) has a `waiting` row until it is decided. `outcome` is `fired`,
-- `skipped` or `waiting`, `reason` one of a closed set (the code's FireReason), `task_id` the
-- fire's task (or, for a skip, the task in its way). Kept `cron.schedule_history_days`, pruned
-- by `decided_at`; a schedule's rows go with it.
CREATE TABLE schedule_fires (
    schedule_id TEXT NOT NULL,
    due_at TIMESTAMP NOT NULL,
    scheduler_id TEXT NOT NULL,
    organisation TEXT NOT NULL,
    decided_at TIMESTAMP NOT NULL,
    outcome TEXT NOT NULL,
    reason TEXT,
    detail TEXT,
    task_id TEXT,
    late_seconds BIGINT NOT NULL,
    late BOOLEAN NOT NULL,
    PRIMARY KEY (schedule_id, due_at)
);
-- Pruning by age, a component at a time.
CREATE INDEX ix_schedule_fires_decided ON schedule_fires (scheduler_id, decided_at);
