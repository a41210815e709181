DROP FUNCTION IF EXISTS {{schema}}.attempt_doom();
DROP FUNCTION IF EXISTS {{schema}}.attempt_begin();

CREATE OR REPLACE FUNCTION {{schema}}.attempt_guard_check() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}.attempt_guard WHERE xid = NEW.xid) THEN
        RAISE EXCEPTION 'watermill-once: refusing to commit: a handler attempt is still running in this transaction'
            USING HINT = 'the subscriber committed before the handler finished (AckDeadline or Close); the message will be redelivered';
    END IF;
    RETURN NULL;
END
$$;
