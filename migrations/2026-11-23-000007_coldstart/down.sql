DROP TABLE coldstart_progress;
ALTER TABLE frontier DROP COLUMN confirmed_at;
