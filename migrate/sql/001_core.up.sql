-- Dedupe claims: one row per (consumer, message key) that a handler applied.
-- The claim is inserted first in the handler's transaction (ON CONFLICT DO NOTHING), so a row
-- exists only if the handler's effects committed with it.
CREATE TABLE {{schema}}.processed_messages (
    consumer       text        NOT NULL,
    message_id     text        NOT NULL,
    payload_sha256 bytea       NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Retention deletes by age; the index keeps those deletes from scanning the table.
CREATE INDEX processed_messages_processed_at_idx ON {{schema}}.processed_messages (processed_at);

-- The outbox, in the layout of a watermill-sql v3 PostgreSQL topic table, holding envelopes
-- in the format of Watermill's components/forwarder. Rows become visible to readers in commit
-- order: readers only take rows whose transaction_id is below the oldest running transaction.
-- uuid is text rather than VARCHAR(36) so that producer ids longer than a UUID survive.
CREATE TABLE {{schema}}.outbox (
    "offset"       bigserial,
    uuid           text      NOT NULL,
    created_at     timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    payload        json               DEFAULT NULL,
    metadata       json               DEFAULT NULL,
    transaction_id xid8      NOT NULL,
    PRIMARY KEY (transaction_id, "offset")
);

-- How far each relay (consumer group) has forwarded the outbox; watermill-sql's offsets layout.
CREATE TABLE {{schema}}.outbox_offsets (
    consumer_group                varchar(255) NOT NULL PRIMARY KEY,
    offset_acked                  bigint,
    last_processed_transaction_id xid8         NOT NULL
);

-- Attempt guard. When the middleware works inside the transaction of watermill-sql's
-- subscriber, that subscriber (not us) commits it, and it commits when it stops waiting for the
-- ack: on Close or after its AckDeadline, possibly while our handler is half way through. A guard
-- row lives for the duration of each attempt; the deferred trigger fails any COMMIT that happens
-- while one still exists, so half an attempt can never be committed.
CREATE UNLOGGED TABLE {{schema}}.attempt_guard (
    xid xid8 PRIMARY KEY
);

CREATE FUNCTION {{schema}}.attempt_guard_check() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}.attempt_guard WHERE xid = NEW.xid) THEN
        RAISE EXCEPTION 'watermill-once: refusing to commit: a handler attempt is still running in this transaction'
            USING HINT = 'the subscriber committed before the handler finished (AckDeadline or Close); the message will be redelivered';
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER attempt_guard_at_commit
    AFTER INSERT ON {{schema}}.attempt_guard
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.attempt_guard_check();

-- Outbox rows the relay could not decode (written by something other than watermill-once):
-- set aside here, with the reason, instead of blocking the relay or being dropped.
CREATE TABLE {{schema}}.outbox_rejected (
    relay          varchar(255) NOT NULL,
    "offset"       bigint       NOT NULL,
    transaction_id xid8         NOT NULL,
    uuid           text         NOT NULL,
    payload        json,
    metadata       json,
    error          text         NOT NULL,
    rejected_at    timestamptz  NOT NULL DEFAULT now(),
    PRIMARY KEY (relay, transaction_id, "offset")
);
