DROP INDEX ix_tasks_finished;
DROP TABLE cron_state;
