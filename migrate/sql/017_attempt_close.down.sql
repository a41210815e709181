DROP PROCEDURE IF EXISTS {{schema}}.attempt_close();
DROP PROCEDURE IF EXISTS {{schema}}.attempt_check();

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
            USING HINT = 'a handler must not Commit or Rollback the transaction it was given (the library commits it), and a subscriber must not commit before the handler finished (AckDeadline or Close)';
    END IF;
    RETURN NULL;
END
$$;
