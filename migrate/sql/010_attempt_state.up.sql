-- The attempt guard, at a fraction of its cost per message. Until now every attempt in the
-- subscriber's transaction inserted a guard row and deleted it when it ended, and the deferred
-- trigger ran once per attempt at COMMIT: on the server, more work per message than the claim.
-- Now the transaction's attempt state lives in a transaction-local setting
-- (wmonce.attempt_<schema>: open, closed or doomed), which ROLLBACK TO SAVEPOINT reverts together
-- with the attempt, and one guard row per transaction (inserted by its first attempt) queues the
-- check at COMMIT. Rows written the old way (no setting) are checked as before, so binaries of
-- either kind can run against this schema.

-- attempt_begin opens an attempt; the middleware calls it inside the attempt's savepoint, as a
-- condition of the claim. It refuses (SQLSTATE WM001) in a transaction that can no longer
-- commit: an earlier attempt was abandoned (doomed) or never ended (open).
CREATE FUNCTION {{schema}}.attempt_begin() RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    k     constant text := 'wmonce.attempt_' || replace('{{schema}}', '"', '');
    state constant text := current_setting(k, true);
BEGIN
    IF state IN ('open', 'doomed') THEN
        RAISE EXCEPTION 'watermill-once: this transaction can no longer commit: an earlier attempt in it was abandoned'
            USING ERRCODE = 'WM001';
    END IF;
    IF state IS NULL OR state = '' THEN
        INSERT INTO {{schema}}.attempt_guard (xid) VALUES (pg_current_xact_id());
    END IF;
    PERFORM set_config(k, 'open', true);
    RETURN true;
END
$$;

-- attempt_doom marks the transaction as unable to commit, after the middleware rolled back an
-- attempt that cannot succeed in it (a serialization failure under its snapshot).
CREATE FUNCTION {{schema}}.attempt_doom() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    k     constant text := 'wmonce.attempt_' || replace('{{schema}}', '"', '');
    state constant text := current_setting(k, true);
BEGIN
    IF state IS NULL OR state = '' THEN
        INSERT INTO {{schema}}.attempt_guard (xid) VALUES (pg_current_xact_id()) ON CONFLICT DO NOTHING;
    END IF;
    PERFORM set_config(k, 'doomed', true);
END
$$;

-- At COMMIT: closed means every attempt ended, and the transaction's guard row goes; open or
-- doomed refuse the COMMIT. Without the setting, the row is one of the old protocol's: it still
-- exists only while its attempt runs.
CREATE OR REPLACE FUNCTION {{schema}}.attempt_guard_check() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    state constant text := current_setting('wmonce.attempt_' || replace('{{schema}}', '"', ''), true);
BEGIN
    IF state = 'closed' THEN
        DELETE FROM {{schema}}.attempt_guard WHERE xid = NEW.xid;
    ELSIF state = 'doomed' THEN
        RAISE EXCEPTION 'watermill-once: refusing to commit: an attempt in this transaction was abandoned'
            USING HINT = 'a handler met a serialization failure under the subscriber''s snapshot; the message will be redelivered in a new transaction';
    ELSIF state = 'open' OR EXISTS (SELECT 1 FROM {{schema}}.attempt_guard WHERE xid = NEW.xid) THEN
        RAISE EXCEPTION 'watermill-once: refusing to commit: a handler attempt is still running in this transaction'
            USING HINT = 'the subscriber committed before the handler finished (AckDeadline or Close); the message will be redelivered';
    END IF;
    RETURN NULL;
END
$$;
