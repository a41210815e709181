-- Every row still carries its envelope in payload: dropping the columns loses nothing the
-- Relay needs. A Debezium connector reading this outbox must be removed first (wmonce connector
-- delete): its router would find no destination.
ALTER TABLE {{schema}}.outbox
    DROP COLUMN IF EXISTS payload_bytes,
    DROP COLUMN IF EXISTS type,
    DROP COLUMN IF EXISTS partition_key,
    DROP COLUMN IF EXISTS destination;
