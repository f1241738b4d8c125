-- Whether an object's work was planned when its row was written. A row recorded from a lookup
-- (a due schedule's object the frontier lacked, a de-duplication sibling) was not: ColdStart
-- plans it as it would a new object, instead of passing over a row that matches Octopoes.
-- Rows written before this were planned by the event or pass that wrote them.
ALTER TABLE frontier ADD COLUMN planned BOOLEAN NOT NULL DEFAULT TRUE;
