-- The cron's due schedules of one scheduler, oldest deadline first, paged by (deadline_at, id).
-- The index led by deadline_at made each tick walk every scheduler's due rows to find one
-- scheduler's (the report table's tick, every second, read all due boefje schedules), and a page
-- after the first could not start where the last ended: with 100,000 due schedules waiting (an
-- Octopoes outage, no catalogue) page 50 read 50,000 index rows to answer 1,000, and a tick was
-- quadratic in the due rows. Led by scheduler_id, with the page's start as a row comparison, a
-- page reads its own rows.
DROP INDEX ix_schedules_due;
CREATE INDEX ix_schedules_due ON schedules (scheduler_id, deadline_at, id) WHERE enabled;
