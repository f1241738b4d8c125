-- Waiting work moves out of `tasks` into a table of its own, so that a pop is a HOT update.
--
-- PostgreSQL updates a row in place (HOT: one WAL record, no index writes) only when no column
-- the update changes appears in any index of the table, as a key or in a partial index's
-- predicate. Every index that found waiting work named `status`, so each pop wrote a new row
-- version and an entry into every index. Now `tasks` is the record of every task, indexed only
-- by columns that never change after the insert (id, created_at, organisation, hash), and
-- `task_queue` holds one row per waiting (pending or queued) task with the columns a heap holds
-- (everything but the payload and the lease). A pop updates the task in place and deletes its
-- queue row; a push inserts both. The broker keeps the two in step in the same statement or
-- transaction (src/storage/tasks.rs); `tasks.status` stays the truth the API answers from.
CREATE TABLE task_queue (
    task_id TEXT PRIMARY KEY NOT NULL,
    scheduler_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'queued')),
    priority BIGINT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    modified_at TIMESTAMP NOT NULL,
    hash TEXT,
    schedule_id TEXT,
    organisation TEXT NOT NULL,
    plugin_id TEXT,
    oci_image TEXT,
    input_ooi TEXT,
    deduplication_key TEXT
);

INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at, modified_at, hash,
        schedule_id, organisation, plugin_id, oci_image, input_ooi, deduplication_key)
    SELECT id, scheduler_id, status, priority, created_at, modified_at, hash, schedule_id,
        organisation, plugin_id, oci_image, input_ooi, deduplication_key
    FROM tasks WHERE status IN ('pending', 'queued');

-- Waiting work in pop order: heap rebuild, refill from pending, keyset pages.
CREATE INDEX ix_task_queue_rank ON task_queue (scheduler_id, status, priority, created_at, task_id);
-- Pending work by the fields workers and the webapp select by (queued work is indexed in memory).
CREATE INDEX ix_task_queue_pending_organisation
    ON task_queue (scheduler_id, organisation, priority, created_at, task_id)
    WHERE status = 'pending';
CREATE INDEX ix_task_queue_pending_plugin_id
    ON task_queue (scheduler_id, plugin_id, priority, created_at, task_id)
    WHERE status = 'pending' AND plugin_id IS NOT NULL;
CREATE INDEX ix_task_queue_pending_oci_image
    ON task_queue (scheduler_id, oci_image, priority, created_at, task_id)
    WHERE status = 'pending' AND oci_image IS NOT NULL;
CREATE INDEX ix_task_queue_pending_input_ooi
    ON task_queue (scheduler_id, input_ooi, priority, created_at, task_id)
    WHERE status = 'pending' AND input_ooi IS NOT NULL;
CREATE INDEX ix_task_queue_pending_deduplication_key
    ON task_queue (scheduler_id, deduplication_key, priority, created_at, task_id)
    WHERE status = 'pending' AND deduplication_key IS NOT NULL;
-- Waiting rows whose key fields are not filled in (see migration 4): a rebuild fills them in.
CREATE INDEX ix_task_queue_keys_missing ON task_queue (scheduler_id, task_id)
    WHERE plugin_id IS NULL;

-- What `tasks` keeps: the list's orderings (created_at, organisation) and the hash, which finds
-- both the waiting task of some work (push de-duplication, by scheduler and status in the row)
-- and its last finished run (the scoring strategies). None of them changes after the insert.
DROP INDEX ix_tasks_waiting;
DROP INDEX ix_tasks_hash_waiting;
DROP INDEX ix_tasks_keys_missing;
DROP INDEX ix_tasks_pending_organisation;
DROP INDEX ix_tasks_pending_plugin_id;
DROP INDEX ix_tasks_pending_oci_image;
DROP INDEX ix_tasks_pending_input_ooi;
DROP INDEX ix_tasks_pending_deduplication_key;
DROP INDEX ix_tasks_hash_finished;
-- Pruning walks `ix_tasks_created_at` instead (a task finished before a time was created
-- before it).
DROP INDEX ix_tasks_finished;
CREATE INDEX ix_tasks_hash ON tasks (hash);
