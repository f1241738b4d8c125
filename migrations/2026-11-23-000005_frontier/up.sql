-- Every object the scheduler plans work for (from Octopoes' events and snapshots), and the raw
-- files it planned normalizers for. Only the frontier module writes these tables; writes are
-- upserts that change nothing when the same event comes twice.
CREATE TABLE frontier (
    organisation TEXT NOT NULL,
    reference TEXT NOT NULL,
    object_type TEXT NOT NULL,
    scan_level BIGINT,
    scan_profile_type TEXT,
    first_seen TIMESTAMP NOT NULL,
    last_seen TIMESTAMP NOT NULL,
    gone_at TIMESTAMP,
    PRIMARY KEY (organisation, reference)
);
CREATE INDEX ix_frontier_type ON frontier (organisation, object_type) WHERE gone_at IS NULL;

CREATE TABLE raw_files (
    id TEXT PRIMARY KEY NOT NULL,
    organisation TEXT NOT NULL,
    mime_types TEXT NOT NULL,
    received_at TIMESTAMP NOT NULL
);
