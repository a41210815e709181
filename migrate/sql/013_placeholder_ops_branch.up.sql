-- Placeholder on branch ops only: keeps versions 1..N without gaps until the branch that
-- owns 013 lands. DROP THIS FILE AT MERGE (the owning branch brings the real 013).
SELECT 1;
