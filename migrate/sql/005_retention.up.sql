-- Retention (package retention) deletes each consumer's claims older than that consumer's
-- window. This index finds them directly, however long other consumers keep theirs, and also
-- answers "newest claim per consumer" without reading the table. It replaces the index on
-- processed_at alone, which served retention across all consumers and which nothing else reads,
-- so every claim still maintains two indexes (the primary key and this one).
-- On a large existing table, build it beforehand without blocking writes:
--   CREATE INDEX CONCURRENTLY processed_messages_consumer_processed_at_idx
--       ON <schema>.processed_messages (consumer, processed_at);
-- IF NOT EXISTS then leaves it as it is here.
CREATE INDEX IF NOT EXISTS processed_messages_consumer_processed_at_idx
    ON {{schema}}.processed_messages (consumer, processed_at);
DROP INDEX IF EXISTS {{schema}}.processed_messages_processed_at_idx;

-- Finished inbox rows (DONE, SKIPPED) by consumer and age, for the janitor: each round finds
-- what expired, or that nothing did, without walking the inbox. Rows enter the index when they
-- finish; unfinished rows stay out.
CREATE INDEX IF NOT EXISTS inbox_finished_idx
    ON {{schema}}.inbox (consumer, finished_at) WHERE status IN ('DONE', 'SKIPPED');
