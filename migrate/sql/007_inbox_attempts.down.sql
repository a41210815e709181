DROP TABLE IF EXISTS {{schema}}.inbox_attempts;
