-- Effects outside the database (issue 6): intent records sent by a state machine, stored
-- responses of the HTTP Idempotency-Key middleware, and per-entity versions for ordered writes.

-- Intents: "this event must cause this external effect once", recorded in the handler's
-- transaction and worked by intent.Sender. intent_key is the downstream idempotency key derived
-- from (consumer, event id, step); it is also sent to the provider, so UNIQUE (channel,
-- intent_key) is both the dedupe of the intent and the key the provider dedupes on.
-- Status: PENDING -> SENDING -> SENT, or FAILED (attempts exhausted or rejected) or SKIPPED (a
-- crash in SENDING on a channel configured to skip). claim_token and lease_until fence every
-- state change of a claimed row, like a job queue.
CREATE TABLE {{schema}}.intents (
    id          bigserial   PRIMARY KEY,
    channel     text        NOT NULL,
    intent_key  text        NOT NULL,
    consumer    text        NOT NULL,
    event_id    text        NOT NULL,
    step        text        NOT NULL,
    payload     bytea       NOT NULL,
    status      text        NOT NULL DEFAULT 'PENDING'
                CHECK (status IN ('PENDING', 'SENDING', 'SENT', 'FAILED', 'SKIPPED')),
    attempts    integer     NOT NULL DEFAULT 0,
    run_after   timestamptz NOT NULL DEFAULT now(),
    claim_token uuid,
    lease_until timestamptz,
    provider_id text,
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz,
    UNIQUE (channel, intent_key),
    CHECK (status <> 'SENDING' OR (claim_token IS NOT NULL AND lease_until IS NOT NULL))
);

-- The sender's two claim queries: ready PENDING rows in id order, and SENDING rows whose lease
-- ran out (the sender that held them crashed or lost its database connection mid-call).
CREATE INDEX intents_pending_idx ON {{schema}}.intents (channel, run_after, id) WHERE status = 'PENDING';
CREATE INDEX intents_sending_idx ON {{schema}}.intents (channel, lease_until) WHERE status = 'SENDING';
-- Operators look for parked rows (alerts, requeue).
CREATE INDEX intents_parked_idx ON {{schema}}.intents (channel, updated_at) WHERE status IN ('FAILED', 'SKIPPED');

-- Stored responses of httpidem.Middleware, one per (client scope, Idempotency-Key). A row is
-- written in the same transaction as the request's effects, so it exists only if they
-- committed; while the first request runs, concurrent ones are turned away by a transaction
-- advisory lock, not by a row. Rows older than the retention window count as absent and are
-- deleted by DeleteExpired.
CREATE TABLE {{schema}}.http_idempotency_keys (
    scope            text        NOT NULL,
    idem_key         text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    method           text        NOT NULL,
    request_uri      text        NOT NULL,
    response_status  integer     NOT NULL,
    response_headers jsonb       NOT NULL,
    response_body    bytea       NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, idem_key)
);

CREATE INDEX http_idempotency_keys_created_at_idx ON {{schema}}.http_idempotency_keys (created_at);

-- The last applied version of each entity, for versioned.Versions: deltas apply only at
-- stored + 1, full states only above the stored version.
CREATE TABLE {{schema}}.entity_versions (
    entity_type text        NOT NULL,
    entity_id   text        NOT NULL,
    version     bigint      NOT NULL CHECK (version >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (entity_type, entity_id)
);
