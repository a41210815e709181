-- A position must survive a move to another cluster (pg_dump/pg_restore, a logical-replication
-- move): transaction ids do not, so a restored position can be ahead of the new cluster's
-- counter, and rows written after the restore get ids that look older than it.
--   offset_high        the outbox "offset" sequence's value read when snapshot was recorded.
--                      Every row visible in snapshot had its offset allocated before that, and
--                      pg_dump carries the sequence over, so a row written after a restore has
--                      a higher offset whatever its transaction id: a row counts as forwarded
--                      only when it is visible in snapshot AND its offset is <= offset_high
--                      (outbox.Prune, Stats), and a row above offset_high that is visible in
--                      snapshot proves the position is of another cluster (outbox.CheckPositions).
--   system_identifier  pg_control_system().system_identifier of the cluster the position was
--                      recorded on (NULL: not recorded, or not readable by the relay's role).
ALTER TABLE {{schema}}.outbox_offsets
    ADD COLUMN offset_high       bigint NOT NULL DEFAULT 0,
    ADD COLUMN system_identifier bigint;

-- Existing positions were recorded on this cluster (the migration runs where they live): every
-- row visible in their snapshot has an offset at or below the sequence's value now.
UPDATE {{schema}}.outbox_offsets
SET offset_high = coalesce(pg_sequence_last_value(pg_get_serial_sequence('{{schema}}.outbox', 'offset')::regclass), 0);
