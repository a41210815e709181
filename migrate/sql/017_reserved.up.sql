-- Placeholder for version 017, taken by another branch of this release: migration versions are
-- 1..N without gaps, and this branch's migration is 019. Dropped when that branch is merged.
SELECT 1;
