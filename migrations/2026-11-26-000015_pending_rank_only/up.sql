-- Every index on the queue tables answers a query real clients send, and nothing else: each costs
-- every push (and every refill) an entry, in time and write-ahead log (docs/ARCHITECTURE.md,
-- "Indexes and the queries that need them").
--
-- `ix_task_queue_rank` held every waiting row in pop order, queued ones too. Queued rows are in
-- the heap, in memory: the table's only reads of them are at a rebuild, which reads them all in
-- the table's own order (a rebuild after `maxsize` was lowered keeps the best as it reads). So
-- only pending rows are indexed in pop order: the refill, the head of the backlog a filtered pop
-- looks at, the swap at a rebuild. A push into a heap with room writes one index entry fewer, and
-- a refill (pending to queued) no new one.
DROP INDEX ix_task_queue_rank;
CREATE INDEX ix_task_queue_pending_rank ON task_queue (scheduler_id, priority, created_at, task_id)
    WHERE status = 'pending';
