DROP TABLE listener_parked;
