DROP TABLE flush_barrier;
