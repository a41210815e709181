-- Delayed delivery (outbox.Relay, package doc "Delayed delivery"): a row whose message carries
-- _watermill_delayed_until in the future is copied here when the relay reads it, the position
-- moves on, and the relay publishes it from here when it is due, with a timer for the earliest
-- due_at (no polling). As with outbox_held, the copy keeps everything needed to publish it, so
-- outbox retention may delete the original once the position has passed it.
CREATE TABLE {{schema}}.outbox_delayed (
    relay          varchar(255) NOT NULL,
    seq            bigserial    NOT NULL,
    topic          text         NOT NULL,
    due_at         timestamptz  NOT NULL,
    "offset"       bigint       NOT NULL,
    transaction_id xid8         NOT NULL,
    uuid           text         NOT NULL,
    source         text         NOT NULL DEFAULT '',
    created_at     timestamp    NOT NULL,
    payload        json,
    metadata       json,
    delayed_at     timestamptz  NOT NULL DEFAULT now(),
    PRIMARY KEY (relay, seq),
    UNIQUE (relay, transaction_id, "offset")
);

-- Due rows are read earliest first; the earliest due_at sets the relay's timer.
CREATE INDEX outbox_delayed_due_idx ON {{schema}}.outbox_delayed (relay, due_at, seq);

-- Pause (outbox.PauseRelay): while paused_at is set, the relays of that name publish nothing
-- (rows keep accumulating in the outbox and are published, in order, after ResumeRelay).
ALTER TABLE {{schema}}.outbox_offsets ADD COLUMN paused_at timestamptz;

-- Pause of an inbox consumer (inbox.Ops.Pause): while a row exists, no Processor of the
-- consumer claims rows; the Receiver goes on storing them.
CREATE TABLE {{schema}}.inbox_paused (
    consumer  text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
