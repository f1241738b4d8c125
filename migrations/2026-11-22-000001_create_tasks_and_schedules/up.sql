-- Portable SQL: the same file runs on PostgreSQL and SQLite (see migrations/README.md).
CREATE TABLE schedules (
    id TEXT PRIMARY KEY NOT NULL,
    scheduler_id TEXT NOT NULL,
    organisation TEXT NOT NULL,
    hash TEXT UNIQUE,
    data TEXT NOT NULL,
    enabled BOOLEAN NOT NULL DEFAULT TRUE,
    schedule TEXT,
    deadline_at TIMESTAMP,
    created_at TIMESTAMP NOT NULL,
    modified_at TIMESTAMP NOT NULL
);

CREATE INDEX ix_schedules_due ON schedules (scheduler_id, enabled, deadline_at);

CREATE TABLE tasks (
    id TEXT PRIMARY KEY NOT NULL,
    scheduler_id TEXT NOT NULL,
    schedule_id TEXT REFERENCES schedules (id) ON DELETE SET NULL,
    organisation TEXT NOT NULL,
    type TEXT NOT NULL,
    hash TEXT,
    priority BIGINT NOT NULL,
    data TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN
        ('pending', 'queued', 'dispatched', 'running', 'completed', 'failed', 'cancelled')),
    attempts INTEGER NOT NULL DEFAULT 0,
    lease_expires_at TIMESTAMP,
    failure_reason TEXT,
    created_at TIMESTAMP NOT NULL,
    modified_at TIMESTAMP NOT NULL
);

-- Waiting work in pop order: heap rebuild, refill from pending, filtered pops.
CREATE INDEX ix_tasks_waiting ON tasks (scheduler_id, status, priority, created_at, id)
    WHERE status IN ('pending', 'queued');
CREATE INDEX ix_tasks_hash ON tasks (hash);
CREATE INDEX ix_tasks_created_at ON tasks (created_at);
CREATE INDEX ix_tasks_modified_at ON tasks (modified_at);
CREATE INDEX ix_tasks_organisation ON tasks (organisation, created_at);
CREATE INDEX ix_tasks_schedule_id ON tasks (schedule_id);
