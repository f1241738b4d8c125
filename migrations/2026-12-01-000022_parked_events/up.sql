-- Events the listener could not apply for a passing reason long enough to be set aside
-- (`listener::parked`): acked to RabbitMQ once written here, so they no longer hold the head of
-- their queue, and applied again from here by the cron entry `parked`. An object's events apply
-- in the order they were parked (`seq`): its later events are parked behind the first. The
-- object is named by `object_key` (a digest of its organisation and reference, NULL for raw
-- files, which need no order), so an index entry stays small whatever the reference's length.
CREATE TABLE listener_parked (
    id TEXT PRIMARY KEY NOT NULL,
    source TEXT NOT NULL,
    seq BIGINT NOT NULL,
    organisation TEXT NOT NULL,
    object_key TEXT,
    body TEXT NOT NULL,
    reason TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    parked_at TIMESTAMP NOT NULL,
    next_try_at TIMESTAMP NOT NULL,
    claimed_until TIMESTAMP,
    refused TEXT
);
-- An object's parked events, in order: the listener's check of a batch's objects and the
-- claim's "first of its object".
CREATE INDEX ix_listener_parked_object ON listener_parked (object_key, seq)
    WHERE object_key IS NOT NULL;
-- The events due to be tried again, those due longest first: the claim reads only events that
-- are due, and an event that failed again moves behind those that have not been tried since.
CREATE INDEX ix_listener_parked_due ON listener_parked (source, next_try_at, seq)
    WHERE refused IS NULL;
