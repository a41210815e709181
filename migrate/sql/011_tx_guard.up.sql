-- The attempt guard on every transaction the library lends to user code, not only on
-- watermill-sql's subscriber transaction. A handler that calls Commit (or Rollback) on the
-- transaction it was given must not end it on the server half way: the claim, the handler's
-- writes and its outputs commit together or not at all. attempt_open() opens the guard in a
-- transaction of the library's own (its first attempt inserts the transaction's guard row, as
-- attempt_begin() does); the guard row's deferred trigger then refuses any COMMIT until the
-- library marks the attempt closed, just before its own COMMIT. A procedure, so that the call
-- returns no rows and can travel with the transaction's next statement (pgtx.DeferredPrefix).
CREATE PROCEDURE {{schema}}.attempt_open()
LANGUAGE sql AS $$
    SELECT {{schema}}.attempt_begin();
$$;

-- The refusal now reads as what it most often is: a handler committing the transaction it was
-- lent. The logic is unchanged from migration 010.
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
