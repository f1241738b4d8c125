DROP INDEX ix_schedules_organisation;
DROP INDEX ix_schedules_created;
DROP INDEX ix_schedules_due;
CREATE INDEX ix_schedules_due ON schedules (scheduler_id, enabled, deadline_at);
ALTER TABLE schedules DROP COLUMN disabled_reason;
