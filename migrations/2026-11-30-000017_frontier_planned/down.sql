ALTER TABLE frontier DROP COLUMN planned;
