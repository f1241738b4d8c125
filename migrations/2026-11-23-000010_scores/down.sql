DROP INDEX ix_tasks_hash_finished;
DROP TABLE task_scores;
