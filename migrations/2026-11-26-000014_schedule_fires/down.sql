DROP INDEX ix_schedule_fires_decided;
DROP TABLE schedule_fires;
