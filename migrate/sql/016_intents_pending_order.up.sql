-- The intent sender claims the oldest ready PENDING intent (ORDER BY id LIMIT 1). No index gave
-- that order over PENDING rows alone (intents_pending_idx is ordered by channel and run_after),
-- so PostgreSQL walked the primary key past every SENT intent still retained, on every claim:
-- 19,000 rows filtered and 4-16 ms a claim at 19,000 sent and 1,000 pending, growing with
-- retention. This index holds the PENDING rows in id order. It is built in the migration's
-- transaction and blocks writes to intents while it builds: on a large table, run it at a
-- quiet time.
CREATE INDEX intents_pending_id_idx ON {{schema}}.intents (id) WHERE status = 'PENDING';
