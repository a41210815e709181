DROP INDEX IF EXISTS {{schema}}.inbox_finished_idx;
CREATE INDEX IF NOT EXISTS processed_messages_processed_at_idx ON {{schema}}.processed_messages (processed_at);
DROP INDEX IF EXISTS {{schema}}.processed_messages_consumer_processed_at_idx;
