-- The attempt guard's own statements fail once the transaction they belong to is gone. A handler
-- that sends COMMIT (or ROLLBACK) as SQL text ends the transaction on the server while
-- database/sql still holds it open: the guard row's trigger refuses the COMMIT and the server
-- rolls everything back, but what the library sent next ran in autocommit, where SET LOCAL is
-- only a warning: its check passed and its own COMMIT "succeeded" with nothing in it. Now the
-- check and the close are procedures that raise (SQLSTATE WM002, the guard's refusal) unless
-- the attempt is open in the current transaction, so the library learns that the handler ended
-- it (wmonce.ErrHandlerEndedTx), parks the message and sends no COMMIT. The guard's refusal of a
-- COMMIT while an attempt runs carries the same SQLSTATE, so that a handler returning that error
-- is recognised too (a doomed transaction's refusal keeps P0001: no handler ended it).

CREATE PROCEDURE {{schema}}.attempt_check()
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('wmonce.attempt_' || replace('{{schema}}', '"', ''), true) IS DISTINCT FROM 'open' THEN
        RAISE EXCEPTION 'watermill-once: refused: the handler ended the transaction it was lent (COMMIT or ROLLBACK), so nothing of this attempt is applied'
            USING ERRCODE = 'WM002', HINT = 'a handler must not Commit or Rollback the transaction it was given (the library commits it)';
    END IF;
END
$$;

CREATE PROCEDURE {{schema}}.attempt_close()
LANGUAGE plpgsql AS $$
BEGIN
    CALL {{schema}}.attempt_check();
    PERFORM set_config('wmonce.attempt_' || replace('{{schema}}', '"', ''), 'closed', true);
END
$$;

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
        RAISE EXCEPTION 'watermill-once: refusing to commit: a handler attempt is still running in this transaction; the transaction is rolled back and nothing of it is applied'
            USING ERRCODE = 'WM002', HINT = 'a handler must not Commit or Rollback the transaction it was given (the library commits it), and a subscriber must not commit before the handler finished (AckDeadline or Close)';
    END IF;
    RETURN NULL;
END
$$;
