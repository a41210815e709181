// Package broker builds Watermill publishers and subscribers for Kafka, RabbitMQ or Watermill's
// SQL Pub/Sub from one Config, so an application swaps brokers by configuration
// (BROKER=sql|kafka|amqp) without touching its handlers:
//
//	cfg, err := broker.ConfigFromEnv()          // BROKER, DATABASE_URL, KAFKA_BROKERS, AMQP_URL, ...
//	b, err := broker.New(ctx, db, cfg, logger)  // checks the broker is reachable
//	pub, err := b.NewPublisher(ctx)             // give it to outbox.NewRelay
//	sub, err := b.NewSubscriber("rewards")      // a consumer group
//
// A Publish that returns nil is durable in the broker. Subscribers deliver every message at
// least once to each consumer group and redeliver what was not acked (nack, crash, lost
// connection). No broker deduplicates: copies reach the handler, and the effectively-once
// middleware absorbs them. Topics and group subscriptions are declared before the first
// publish (Config.Subscriptions, Declare) and again at Subscribe, so a message is never
// published into a void, and a group that first subscribes after messages were published
// receives them (on RabbitMQ with a limit for a topic's later groups: see Declare). Give
// TopicValidator(kind) to outbox.Config so a topic the broker would refuse fails the producing
// transaction.
//
//   - Kafka: watermill-kafka v3 on Sarama, idempotent producer, acks from all in-sync
//     replicas, record key KafkaConfig.PartitionKeyField else the UUID.
//   - RabbitMQ: our own publisher (confirms) and subscriber on amqp091-go in watermill-amqp's
//     wire format; a fanout exchange per topic, a quorum queue per group, an unrouted queue
//     that keeps what no queue was bound for.
//   - SQL: watermill-sql v3 or v4 on PostgreSQL with LISTEN/NOTIFY wake-ups; the
//     effectively-once middleware applies each message in the subscriber's own transaction,
//     so offset, claim and effects commit together.
//
// How each broker behaves (order, redelivery, defaults, versions tested, what to do after a
// backup and restore) is in docs/brokers.md.
package broker
