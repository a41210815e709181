-- An idle relay asks the outbox Writers to wake it (outbox.Relay, package doc "Waking up"):
-- while idle_until is in the future, a transaction that stores outbox rows also sends a
-- pg_notify on the schema's relay channel, delivered at its commit. A busy relay lets it lapse,
-- so that producers do not pay for notifications nobody waits for (a notifying transaction
-- takes a server-wide lock at commit). NULL: never asked.
ALTER TABLE {{schema}}.outbox_offsets ADD COLUMN idle_until timestamptz;
