DROP TABLE {{schema}}.duplicates_per_minute;
DROP FUNCTION {{schema}}.failure_fingerprint(text, text, text, text);
DROP FUNCTION {{schema}}.failure_pattern(text);
