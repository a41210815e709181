-- Sources: which service wrote an outbox row, so that services sharing one schema each forward
-- only their own rows (outbox.Config.Source, outbox.RelayConfig.Source). '' is a row written
-- without a source, as every row before this migration: relays without a Source forward those.
-- A constant default adds the column without rewriting the table.
ALTER TABLE {{schema}}.outbox ADD COLUMN source text NOT NULL DEFAULT '';

-- The Source a relay forwards, written by the relay when it starts. NULL: a relay older than
-- this migration, which forwards every row; the first relay of this version with that name
-- adopts the position for its Source.
ALTER TABLE {{schema}}.outbox_offsets ADD COLUMN source text;

-- Rows the broker refused for good are set aside here too (before, only rows the relay could
-- not decode): topic is the destination the row named (NULL when it could not be decoded),
-- source the row's source, so that republishing it re-enters it for the same relays.
ALTER TABLE {{schema}}.outbox_rejected
    ADD COLUMN topic  text,
    ADD COLUMN source text NOT NULL DEFAULT '';

-- Rows of a topic the broker is failing for (a topic that does not exist, a partition without
-- a leader, ...) wait here, copied with everything needed to publish them, while the relay goes
-- on with the other topics. The relay publishes them in seq order (the order it read them in)
-- once the topic accepts messages again, and keeps the topic's later rows behind them until
-- none is left. The copy keeps them safe from outbox retention, which may delete the original
-- once the relay's position has passed it.
CREATE TABLE {{schema}}.outbox_held (
    relay          varchar(255) NOT NULL,
    seq            bigserial    NOT NULL,
    topic          text         NOT NULL,
    "offset"       bigint       NOT NULL,
    transaction_id xid8         NOT NULL,
    uuid           text         NOT NULL,
    source         text         NOT NULL DEFAULT '',
    created_at     timestamp    NOT NULL,
    payload        json,
    metadata       json,
    held_at        timestamptz  NOT NULL DEFAULT now(),
    PRIMARY KEY (relay, seq),
    UNIQUE (relay, transaction_id, "offset")
);

-- A held topic is published from its oldest row on.
CREATE INDEX outbox_held_topic_idx ON {{schema}}.outbox_held (relay, topic, seq);
