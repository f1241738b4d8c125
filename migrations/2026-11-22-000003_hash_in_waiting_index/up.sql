-- Each heap keeps an index from task hash to task id, so a rebuild reads the hash of every
-- queued task; with the hash in the waiting index the rebuild still reads only the index.
DROP INDEX ix_tasks_waiting;
CREATE INDEX ix_tasks_waiting ON tasks (scheduler_id, status, priority, created_at, id, hash)
    WHERE status IN ('pending', 'queued');
