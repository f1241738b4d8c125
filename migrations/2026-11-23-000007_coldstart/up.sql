-- ColdStart: each pass over an organisation's objects stamps the rows it saw with the pass's
-- start (`confirmed_at`); at the end of a complete pass the organisation's objects it did not
-- see, and that no event touched since it began, are marked gone.
ALTER TABLE frontier ADD COLUMN confirmed_at TIMESTAMP;

-- One row per organisation: where its current (or last) pass is, so a restart resumes it at the
-- page it reached, against the same snapshot (`valid_time`), instead of starting over.
CREATE TABLE coldstart_progress (
    organisation TEXT PRIMARY KEY NOT NULL,
    pass_started_at TIMESTAMP NOT NULL,
    valid_time TIMESTAMP NOT NULL,
    next_offset BIGINT NOT NULL,
    loaded BIGINT NOT NULL,
    total BIGINT,
    completed_at TIMESTAMP,
    updated_at TIMESTAMP NOT NULL
);
