-- The outbox as real columns, so that Debezium's Outbox Event Router reads it as it is
-- (docs/cdc.md): destination is its route.by.field (the topic), partition_key its record key
-- (per-key order), uuid its event id, payload_bytes the raw payload and metadata a header.
-- The Writer fills them in the same INSERT as the envelope in payload, which stays: the built-in
-- Relay, Watermill's forwarder and relays of the previous version read it, so switching between
-- the Relay and Debezium, in either direction, needs no rewrite. Rows written before this
-- migration keep NULL here: Debezium starts at the WAL position of its slot and never reads
-- them (snapshot.mode=no_data), the Relay reads their envelope.
-- Nullable columns without a default are added without rewriting the table.
ALTER TABLE {{schema}}.outbox
    ADD COLUMN destination   text,
    ADD COLUMN partition_key text,
    ADD COLUMN type          text,
    ADD COLUMN payload_bytes bytea;
