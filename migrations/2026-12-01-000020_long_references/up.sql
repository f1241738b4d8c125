-- An object's reference may be longer than an index entry may be: a URL with a long query, as
-- web crawls find, where PostgreSQL refuses an entry over 2,704 bytes ("index row size exceeds
-- btree version 4 maximum"). Such a task's pending row could not be written, so its object was
-- never scanned. The index of pending rows by `input_ooi` now holds references of up to 600
-- characters (at most four bytes each, with the index's other columns), every real one but the
-- longest; a search for a longer one walks the pop order instead (`storage::tasks::heap`), and a
-- search for a shorter one names the bound, so that the planner may use this index.
DROP INDEX ix_task_queue_pending_input_ooi;
CREATE INDEX ix_task_queue_pending_input_ooi
    ON task_queue (scheduler_id, input_ooi, priority, created_at, task_id)
    WHERE status = 'pending' AND input_ooi IS NOT NULL AND length(input_ooi) <= 600;
