-- The relay kept last_processed_transaction_id as a watermark (every row below it published),
-- so an older relay resumes from there: it may publish some rows again, it skips none.
DROP INDEX IF EXISTS {{schema}}.outbox_offset_idx;
ALTER TABLE {{schema}}.outbox_offsets
    DROP COLUMN IF EXISTS target_offset,
    DROP COLUMN IF EXISTS target_snapshot,
    DROP COLUMN IF EXISTS snapshot;
