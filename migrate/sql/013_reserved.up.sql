-- Placeholder for migration 013, which a parallel branch (the Debezium outbox columns) adds:
-- the migrator refuses gaps, and 014 needs a 013 to run on this branch. Drop this file when
-- that branch's 013 is merged.
SELECT 1;
