-- Dedupe claims partitioned by day, for Config.PartitionByDay: retention drops whole partitions
-- instead of deleting rows. The day comes from the time the event occurred, carried in the
-- message (occurred_at), so every copy of an event lands in the same partition as its original.
-- Partitions are created ahead of time by the janitor and on demand by the middleware.
CREATE TABLE {{schema}}.processed_messages_daily (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    occurred_on    date        NOT NULL,
    payload_sha256 bytea       NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id, occurred_on)
) PARTITION BY RANGE (occurred_on);
