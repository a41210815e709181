-- A relay of the previous version would never publish delayed rows: refuse to drop them.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{schema}}.outbox_delayed) THEN
        RAISE EXCEPTION 'watermill-once: outbox_delayed still holds rows a relay has not published'
            USING HINT = 'let them fall due and the relays publish them (wmonce outbox lists them), then migrate down again';
    END IF;
END
$$;
DROP TABLE {{schema}}.inbox_paused;
ALTER TABLE {{schema}}.outbox_offsets DROP COLUMN IF EXISTS paused_at;
DROP TABLE {{schema}}.outbox_delayed;
