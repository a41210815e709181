DROP TABLE IF EXISTS {{schema}}.entity_versions;
DROP TABLE IF EXISTS {{schema}}.http_idempotency_keys;
DROP TABLE IF EXISTS {{schema}}.intents;
