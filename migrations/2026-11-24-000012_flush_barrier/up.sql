-- One row the WAL flush barrier updates (src/queue/engine/flush.rs). A synchronous commit waits
-- for the disk only when its transaction wrote WAL, so the barrier must change a row: assigning
-- a transaction id alone (`txid_current()`) commits without a flush.
CREATE TABLE flush_barrier (
    id INTEGER PRIMARY KEY NOT NULL,
    n BIGINT NOT NULL
);
INSERT INTO flush_barrier (id, n) VALUES (1, 0);
