// Package doctor checks the redelivery horizon against the dedupe keys' retention.
//
// A copy redelivered after its key was pruned (ops/retention) is applied again unless the age
// guard (once.Config.MaxMessageAge) refuses it. Check reads what each broker and the outbox will redeliver and says, per consumer
// and source, whether such a copy can arrive and what to set; `wmonce doctor` prints it,
// StartCheck runs it at a service's start (docs/operations.md, "The redelivery doctor").
//
// # Where it stops
//
// It knows what the brokers are configured to keep, not what an operator may do (republish
// from an archive, raise a retention later). Kafka's retention.bytes is reported, not used.
// Without RabbitMQ's management API, policies are invisible and dead-letter queues are not
// followed: list them among the consumer's queues.
package doctor
