DROP TABLE IF EXISTS {{schema}}.outbox_rejected;
DROP TABLE IF EXISTS {{schema}}.attempt_guard;
DROP FUNCTION IF EXISTS {{schema}}.attempt_guard_check();
DROP TABLE IF EXISTS {{schema}}.outbox_offsets;
DROP TABLE IF EXISTS {{schema}}.outbox;
DROP TABLE IF EXISTS {{schema}}.processed_messages;
