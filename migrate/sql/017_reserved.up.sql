-- Reserved: version 017 belongs to another change made at the same time as 018. Merged
-- together, that change's 017 replaces this pair (All refuses two files of one version);
-- without it, this no-op keeps the versions 1..N without a gap.
DO $$ BEGIN END $$;
