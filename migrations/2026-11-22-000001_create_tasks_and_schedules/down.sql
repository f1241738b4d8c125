DROP TABLE tasks;
DROP TABLE schedules;
