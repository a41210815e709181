DROP PROCEDURE IF EXISTS {{schema}}.attempt_open();

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
