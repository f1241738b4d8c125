-- Schedules as the scheduler runs them: why one was disabled, and the indexes the API's listings
-- (newest first, per organisation) and the due-schedule sweep (oldest due first) read.
ALTER TABLE schedules ADD COLUMN disabled_reason TEXT;
DROP INDEX ix_schedules_due;
CREATE INDEX ix_schedules_due ON schedules (deadline_at, id) WHERE enabled;
CREATE INDEX ix_schedules_created ON schedules (created_at, id);
CREATE INDEX ix_schedules_organisation ON schedules (organisation, created_at);
