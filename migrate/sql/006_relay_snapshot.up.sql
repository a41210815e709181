-- The relay's position becomes a snapshot (pg_snapshot) instead of the (transaction_id, offset)
-- of the last row it published. transaction_id is assigned at a transaction's first write, not
-- at its commit, so publishing in transaction_id order can put a row before a row of the same
-- key that committed earlier. The relay now publishes, round by round, the transactions that
-- committed between two snapshots, each round in insertion ("offset") order.
--   snapshot         every transaction visible in it has been published (S_prev).
--   target_snapshot  set while a round spans several batches: the round is the rows visible in
--                    it and not in snapshot, and those with "offset" <= target_offset are
--                    published. NULL between rounds.
-- offset_acked and last_processed_transaction_id stay as a conservative watermark for older
-- readers: every row with transaction_id < last_processed_transaction_id has been published
-- (the relay writes pg_snapshot_xmin(snapshot) there and 0 into offset_acked).
ALTER TABLE {{schema}}.outbox_offsets
    ADD COLUMN snapshot        pg_snapshot,
    ADD COLUMN target_snapshot pg_snapshot,
    ADD COLUMN target_offset   bigint;

-- An existing position (T, O) says: every row with transaction_id < T was published, and the
-- rows of T up to offset O. That is the snapshot 'T:T:' (visible: transaction_id < T) plus an
-- unfinished round made of T alone ('T+1:T+1:'), published up to O. Nothing is skipped and at
-- most the rest of transaction T is read again. T = 0 (never ran) means nothing was published.
UPDATE {{schema}}.outbox_offsets SET
    snapshot = CASE WHEN last_processed_transaction_id::text::numeric >= 1
        THEN (last_processed_transaction_id::text || ':' || last_processed_transaction_id::text || ':')::pg_snapshot
        ELSE '1:1:'::pg_snapshot END,
    target_snapshot = CASE WHEN last_processed_transaction_id::text::numeric >= 1
        THEN ((last_processed_transaction_id::text::numeric + 1)::text || ':' || (last_processed_transaction_id::text::numeric + 1)::text || ':')::pg_snapshot
        END,
    target_offset = CASE WHEN last_processed_transaction_id::text::numeric >= 1
        THEN coalesce(offset_acked, 0) END;

-- '1:1:' sees no transaction: a position written without a snapshot (by a relay older than this
-- migration, or by hand) starts from the beginning of the outbox: copies, never loss.
ALTER TABLE {{schema}}.outbox_offsets
    ALTER COLUMN snapshot SET DEFAULT '1:1:',
    ALTER COLUMN snapshot SET NOT NULL;

-- Within a round the relay reads in "offset" order; a round larger than one batch continues
-- from the last offset it published. Without this index every batch of a large round would
-- sort the whole round again.
-- On a large existing outbox, build it beforehand without blocking writes:
--   CREATE INDEX CONCURRENTLY outbox_offset_idx ON <schema>.outbox ("offset");
-- IF NOT EXISTS then leaves it as it is here.
CREATE INDEX IF NOT EXISTS outbox_offset_idx ON {{schema}}.outbox ("offset");
