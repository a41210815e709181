ALTER TABLE {{schema}}.outbox_offsets
    DROP COLUMN system_identifier,
    DROP COLUMN offset_high;
