DROP TABLE IF EXISTS {{schema}}.inbox;
