DO $$ BEGIN END $$;
