DROP TABLE IF EXISTS {{schema}}.processed_messages_daily;
