DROP INDEX IF EXISTS {{schema}}.intents_pending_id_idx;
