-- The inbox: messages stored on arrival (and acked at once), processed later by workers.
-- One row per (consumer, message key). The unique key IS the dedupe record: a redelivered copy
-- inserts nothing (ON CONFLICT DO NOTHING). Rows must therefore be kept (DONE) for as long as
-- the broker can redeliver; deleting a DONE row forgets that the message was applied.
--
-- Life of a row:  PENDING -> IN_PROGRESS (claimed, with claim_token and lease_until)
--                 -> DONE | back to PENDING (failed attempt, next_attempt_at in the future)
--                 | FAILED (parked: attempt limit or permanent error) | SKIPPED (by an operator)
-- id gives the received order; per-key ordering uses it.
CREATE TABLE {{schema}}.inbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL,
    message_id      text        NOT NULL,            -- the dedupe key (KeyFunc), by default the UUID
    message_uuid    text        NOT NULL,            -- Watermill UUID, restored for the handler
    ordering_key    text,                            -- NULL: no ordering constraint
    topic           text        NOT NULL DEFAULT '', -- topic the message was received from
    payload         bytea       NOT NULL,
    metadata        jsonb       NOT NULL DEFAULT '{}',
    status          text        NOT NULL DEFAULT 'PENDING',
    attempts        integer     NOT NULL DEFAULT 0,  -- attempts started (incremented at claim)
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claim_token     bigint,                          -- fences every change made by a claimant
    lease_until     timestamptz,
    last_error      text,
    received_at     timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CONSTRAINT inbox_status_check
        CHECK (status IN ('PENDING', 'IN_PROGRESS', 'DONE', 'FAILED', 'SKIPPED')),
    -- A claim exists exactly while the row is IN_PROGRESS: every transition out of it must
    -- clear the token, so a stale claimant can never match it again.
    CONSTRAINT inbox_claim_check
        CHECK ((status = 'IN_PROGRESS') = (claim_token IS NOT NULL AND lease_until IS NOT NULL)),
    CONSTRAINT inbox_consumer_message_id_key UNIQUE (consumer, message_id)
);

-- Work queue: claims scan PENDING rows in received order, the lease reaper scans IN_PROGRESS
-- rows, operations and stats count by status. Finished rows (the bulk of the table) stay out.
CREATE INDEX inbox_work_idx ON {{schema}}.inbox (consumer, status, id)
    WHERE status IN ('PENDING', 'IN_PROGRESS', 'FAILED');

-- Per-key order: a row is eligible only when no older unfinished row of its key exists; this
-- index answers that probe without touching finished rows.
CREATE INDEX inbox_key_head_idx ON {{schema}}.inbox (consumer, ordering_key, id)
    WHERE ordering_key IS NOT NULL AND status IN ('PENDING', 'IN_PROGRESS', 'FAILED');
