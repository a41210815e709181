ALTER TABLE {{schema}}.intents DROP COLUMN IF EXISTS trace_parent, DROP COLUMN IF EXISTS trace_state;
