-- Which instance owns each scheduler's heap when several instances share one PostgreSQL
-- database. The owner renews `expires_at` (on the database's clock); taking over a lapsed or
-- released row raises `epoch`, and every batch an owner commits first checks, in the same
-- transaction, that the row still carries its epoch (a fencing token), so a paused or cut-off
-- former owner can never commit after losing the lease. `address` is where other instances
-- forward the scheduler's pushes, pops and patches. SQLite runs one instance and leaves the
-- table empty.
CREATE TABLE scheduler_owners (
    scheduler_id VARCHAR(32) PRIMARY KEY,
    owner VARCHAR(200),
    address VARCHAR(500),
    epoch BIGINT NOT NULL DEFAULT 0,
    expires_at TIMESTAMPTZ NOT NULL,
    acquired_at TIMESTAMPTZ
);
