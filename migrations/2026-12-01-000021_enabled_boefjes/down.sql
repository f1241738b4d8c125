DROP TABLE enabled_boefjes;
