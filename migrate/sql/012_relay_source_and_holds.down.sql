-- A relay of the previous version would never publish held rows: refuse to drop them. Revert
-- once every held topic has drained (outbox.Status lists none).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}.outbox_held) THEN
        RAISE EXCEPTION 'watermill-once: outbox_held still holds rows a relay has not published'
            USING HINT = 'let the relays publish them (wmonce outbox lists held topics), then migrate down again';
    END IF;
END
$$;
DROP TABLE {{schema}}.outbox_held;
ALTER TABLE {{schema}}.outbox_rejected
    DROP COLUMN IF EXISTS source,
    DROP COLUMN IF EXISTS topic;
ALTER TABLE {{schema}}.outbox_offsets DROP COLUMN IF EXISTS source;
ALTER TABLE {{schema}}.outbox DROP COLUMN IF EXISTS source;
