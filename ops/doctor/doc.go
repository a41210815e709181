// Package doctor checks the redelivery horizon against the dedupe keys' retention.
//
// A broker can deliver a copy of a message long after the original was applied: a Kafka
// consumer group whose offsets were reset (or expired after the broker's
// offsets.retention.minutes) replays its topic back to retention.ms; a RabbitMQ queue without a
// message TTL keeps a duplicate until someone consumes it, and a dead-letter queue until
// someone redrives it; a relay whose offset is reset forwards every outbox row still kept. The
// middleware's claims (and the inbox's finished rows) are pruned after their retention
// (ops/retention). A copy that arrives after its key was pruned is applied again, silently,
// unless the age guard (once.Config.MaxMessageAge) refuses it.
//
// Check reads what each broker will redeliver (Kafka through Sarama's ClusterAdmin
// DescribeConfigs; RabbitMQ through the management API when it is reachable, otherwise the
// queue's own arguments over AMQP) and says, per consumer and source, whether such a copy can
// arrive and what to set. `wmonce doctor` prints the report and exits non-zero on a hazard;
// StartCheck is the same check for a service's start (one log line, Prometheus gauges).
//
// # Where it stops
//
// The doctor knows what the brokers are configured to keep, not what an operator may do:
// a redrive script that republishes from an archive, or a topic whose retention is raised
// later, is beyond it. Kafka's retention.bytes can only make a replay shorter, so it is
// reported, not used. Without the management API, RabbitMQ policies (a message-ttl set by
// policy) are invisible and dead-letter queues are not followed: list them among the
// consumer's queues.
package doctor
