DROP TABLE {{schema}}.duplicates_per_minute;
DROP TABLE {{schema}}.outbox_parked_settled;
DROP INDEX {{schema}}.outbox_parked_idx;
DROP FUNCTION {{schema}}.failure_fingerprint(text, text, text, text);
DROP FUNCTION {{schema}}.failure_group_fingerprint(text, text, text, text);
DROP FUNCTION {{schema}}.failure_pattern(text);
