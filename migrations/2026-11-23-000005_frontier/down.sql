DROP TABLE raw_files;
DROP INDEX ix_frontier_type;
DROP TABLE frontier;
