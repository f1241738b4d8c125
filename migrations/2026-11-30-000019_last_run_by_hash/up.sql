-- A hash's tasks in the order they were created, so that its last finished run is the end of one
-- short walk (`storage::tasks::last_runs`, read for every planned batch). The index on the hash
-- alone made that read fetch every past run of the work, a cost that grew with its history:
-- a boefje run daily keeps 365 tasks a year. Lookups by hash alone (push de-duplication) use the
-- new index's leading column.
CREATE INDEX ix_tasks_hash_created ON tasks (hash, created_at);
DROP INDEX ix_tasks_hash;
