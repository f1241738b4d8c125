DROP INDEX ix_schedules_due;
CREATE INDEX ix_schedules_due ON schedules (deadline_at, id) WHERE enabled;
