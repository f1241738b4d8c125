DROP TABLE scheduler_owners;
