ALTER TABLE {{schema}}.outbox_offsets DROP COLUMN IF EXISTS idle_until;
