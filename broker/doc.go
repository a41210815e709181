// Package broker builds Watermill publishers and subscribers for Kafka, RabbitMQ or Watermill's
// SQL Pub/Sub from one Config, so an application swaps brokers by configuration
// (BROKER=sql|kafka|amqp) without touching its handlers:
//
//	cfg, err := broker.ConfigFromEnv()          // BROKER, DATABASE_URL, KAFKA_BROKERS, AMQP_URL, ...
//	b, err := broker.New(ctx, db, cfg, logger)  // checks the broker is reachable
//	pub, err := b.NewPublisher(ctx)             // give it to outbox.NewRelay
//	sub, err := b.NewSubscriber("rewards")      // a consumer group
//
// # What every broker guarantees here, and what it does not
//
// A Publish that returns nil is durable in the broker. Subscribers deliver every message at
// least once to each consumer group and redeliver what was not acked (nack, crash, lost
// connection). No broker deduplicates: copies reach the handler, and the effectively-once
// middleware absorbs them. Topics and group subscriptions are declared before the first
// publish (Config.Subscriptions, Declare) and again at Subscribe, so a message is never
// published into a void, and a group that first subscribes after messages were published
// receives them (on RabbitMQ with a limit for a topic's later groups: see Declare). Topic names are checked per broker (ValidateTopic); give
// TopicValidator(kind) to outbox.Config so a bad topic fails the producing transaction.
//
// # Kafka (watermill-kafka v3, Sarama)
//
//   - Idempotent producer (Producer.Idempotent): the broker drops duplicates created by the
//     producer's own retries; acks from all in-sync replicas (RequiredAcks=WaitForAll); one
//     request in flight (Net.MaxOpenRequests=1), which Sarama requires with idempotence and
//     which keeps retries in order. Publish sends a call's messages together (one produce
//     request per broker, or a few) and returns once all are acknowledged; a call is cut where
//     a record key repeats, so a failure never lets a key's later message overtake an earlier
//     one (see kafkaPublisher).
//   - Record key = the metadata field KafkaConfig.PartitionKeyField ("partition_key"), else
//     the message UUID: messages with one key stay in one partition, in publish order.
//   - Consumer groups start from the oldest offset when they have no commit. Watermill keeps one
//     message in flight per partition; an ack marks the offset, committed every second, so a
//     crash redelivers up to a second of acked messages. A nack redelivers after
//     NackDelay, forever: park poison messages with the middleware Stack.
//   - Topics are created with Partitions and ReplicationFactor (-1: the cluster default). Set
//     min.insync.replicas on the cluster: acks=all means "all in-sync replicas", however few.
//   - Protocol version 2.1 (KafkaProtocolVersion) for every target; see "Kafka versions".
//   - A publish whose partition has no leader yet (a topic just created, a broker restarting)
//     is retried with backoff for up to 30 s: Sarama's idempotent producer retries such a
//     batch without waiting between attempts and gives up within milliseconds, and after
//     three failed lookups its circuit breaker refuses the topic for 10 s.
//   - Topics are created (and DeleteKafkaTopics deletes them) through one admin connection per
//     Broker. Sarama never reconnects a connection that failed, so when a request gets no
//     answer (the broker restarted, crashed or moved) the admin client is replaced and the
//     request retried with backoff, up to 30 s per topic. The publisher and subscribers
//     reconnect on their own (a subscriber rejoins its group with a new Sarama client).
//   - Every Subscribe is a member of its consumer group. A group shared by several
//     topics rebalances whenever one of its subscriptions starts or stops, and
//     watermill-kafka finishes handing over an in-flight message before it leaves a
//     session, so such a rebalance can wait for a slow handler, up to the 20 s
//     rebalance timeout. Prefer a group per handler.
//
// # Kafka versions
//
// Sarama speaks protocol 2.1 to every target (KafkaProtocolVersion explains the choice):
//
//	target                      protocol 2.1 (used)                     protocol 3.6 (Sarama's newest)
//	Apache Kafka 3.9.1 (KRaft)  pass: broker tests, e2e + broker SIGKILL  pass: broker package's Kafka tests
//	Apache Kafka 4.4.0 (KRaft)  pass: broker tests, e2e + broker SIGKILL  pass: broker package's Kafka tests
//	kfake (embedded, demos)     pass: broker tests, e2e                   fail: no consumer group session
//
// 2.1 is the floor Kafka 4 keeps (KIP-896 removed every older request version), so the same
// protocol works on 3.9, 4.x and kfake, and what the tests exercise on kfake is what runs
// against a real cluster. Clusters older than 2.1 are not supported. Real brokers run with
// e2e/services (KAFKA_BROKERS=127.0.0.1:9092 for 3.9, 127.0.0.1:9094 for 4.x); the tests
// log the release the cluster's ApiVersions answer matches (TestKafkaBrokerVersion, and the
// e2e summary). On a real cluster, KAFKA_SESSION_TIMEOUT must lie within the broker's
// group.min.session.timeout.ms and group.max.session.timeout.ms (6 s and 30 min by default;
// kfake here accepts 1 s).
//
// # RabbitMQ (amqp091-go, watermill-amqp's wire format)
//
//   - Publisher confirms: Publish returns after RabbitMQ acked every message of the call (for a
//     quorum queue: written to a majority of its replicas); persistent delivery mode.
//   - Topology: a durable fanout exchange per topic (<prefix><topic>), a durable queue per
//     consumer group (<prefix><topic>:<group>) bound to it — the consumer-group shape: every
//     group gets every message, members of a group share its queue. Quorum queues by default.
//     Queues of Config.Subscriptions are declared before anything is published; every topic
//     exchange has an alternate exchange whose queue (<prefix>wmonce.unrouted) keeps messages
//     that no queue was bound for, instead of RabbitMQ dropping them.
//   - Publishing before the first subscriber: when a group's queue is first declared
//     (Subscribe, Declare, Config.Subscriptions; once per Broker), the messages waiting in the
//     unrouted queue are published again to their own exchanges, each acked there only after
//     RabbitMQ confirmed its new copy. The topic's messages reach the queues bound by then;
//     the others go back to wait. So the same code works without Config.Subscriptions on
//     every broker, with one difference for several groups on one topic: those messages go
//     to the groups bound when the first is declared, not to a group declared later (see
//     Declare). The pass costs in proportion to the unrouted queue: purge what nobody will
//     ever subscribe to. A message published in the same instant as the topic's first
//     queue is bound can miss the pass; the next one moves it.
//   - Marshaler writes what watermill-amqp writes (UUID in _watermill_message_uuid, metadata
//     as headers), and the UUID in the message-id property too. It accepts non-string headers
//     (x-delivery-count from quorum queues, x-death after dead-lettering), which
//     watermill-amqp's marshaler refuses, making the message loop. It exposes the AMQP
//     properties as metadata (MetadataAMQPMessageID "amqp_message_id", amqp_correlation_id,
//     amqp_timestamp, ...), and a delivery without the UUID header takes its message-id as the
//     UUID: messages of producers that are not Watermill are keyed by their id with the
//     default key, or with wmonce.KeyFromMetadata(broker.MetadataAMQPMessageID).
//   - AMQPConfig.Workers (DefaultAMQPWorkers) messages in flight per subscription and
//     Prefetch (DefaultAMQPPrefetchPerWorker per worker) unacked messages handed over by
//     RabbitMQ; a nack hands the message back after NackDelay. A lost connection is redialled
//     with backoff; unacked messages are redelivered. Order: with Workers > 1 messages of one queue finish in any order, and
//     with Prefetch > 1 a requeued message comes back after messages that were behind it. Set
//     Workers 1 (and Prefetch 1) where queue order matters.
//   - Concurrent Publish calls share one channel and wait for their confirms together.
//   - The publisher and subscriber are our own, because watermill-amqp's reconnect has a data
//     race (ThreeDotsLabs/watermill#693); see amqp_pubsub.go.
//
// Ours or watermill-amqp's: prefer these for new code (no reconnect race; confirms, quorum
// queues, the unrouted queue and a delayed nack by default; one Config for every broker).
// Keep watermill-amqp's Subscriber and Publisher where they already run and their topology
// (naming, routing keys, topic or direct exchanges, a custom TopologyBuilder) is shared with
// other services: the effectively-once middleware, the Stack and the inbox work in front of them
// unchanged (package interop tests it). Then set Publish.ConfirmDelivery, use Marshaler as its
// Config.Marshaler (its default one loops on RabbitMQ's numeric headers), wrap handlers in the
// Stack (its nack requeues at once) and declare queues before publishing (its publisher declares
// none).
//
// # SQL (watermill-sql v3 or v4 on PostgreSQL)
//
//   - SQLConfig.WatermillSQL (BROKER_SQL_WATERMILL) chooses the watermill-sql major version: 4
//     (the default, over database/sql, the version Watermill's examples use) or 3. Both create
//     and read the same tables with the same queries: processes on either version share topics
//     and consumer groups, and a deployment moves from one to the other, either way, with no
//     migration; a group continues where it stopped. What changes with the version is which
//     watermill-sql TxFromContext finds the subscriber's transaction in a message context: a
//     handler should use pgtx.TxFromContext (the middleware's transaction, which on this broker
//     is the subscriber's) or pgtx.SubscriberTxFromContext, which find it on both. Version 4's
//     publisher runs its INSERT under the first message's context (version 3 under
//     context.Background): a message whose context has ended is refused with the context's
//     error.
//   - Topics are tables in SQLConfig.Schema ("wmonce_broker"), with a TEXT uuid and a BYTEA
//     payload; consumer groups are rows of the topic's offsets table, declared at offset zero so
//     a new group reads every retained row. Publish is an INSERT that commits on return.
//   - The subscriber reads up to BatchSize rows in a REPEATABLE READ transaction and commits
//     the group's offset in it. The effectively-once middleware applies each message in a
//     savepoint of that same transaction, so offset, dedupe claim and effects commit together:
//     on this broker a crash loses nothing and redelivers nothing that was applied.
//   - Rows become visible only when every older transaction has finished: a long transaction
//     anywhere on the server delays delivery. Order is (transaction_id, offset), and
//     transaction_id is assigned at a transaction's first write, not at its commit: first-write
//     order, which for two writers of one key can be the reverse of their commits (the outbox
//     relay publishes by commit instead; see package outbox, Order). Rows are never deleted by
//     watermill-sql.
//   - Wake-ups: a statement trigger on every topic table calls pg_notify (channel
//     SQLConfig.NotifyChannel) and one LISTEN connection per Broker, outside the pool, wakes
//     the table's subscriptions; a notified row still hidden by an older transaction is
//     re-checked against the server's xmin with a backoff of at most PollInterval. Idle, a
//     subscription polls every IdlePollInterval (3s); without LISTEN (DisableListen, a driver
//     other than pgx, a lost connection) every PollInterval (100ms).
//   - A nacked message is delivered again inside the same transaction, which stays open (and
//     keeps the group's offset row locked) until the message is acked or AckDeadline passes,
//     unless that transaction can no longer commit: after each nack the subscription runs one
//     statement in it, and when that fails (connection lost, transaction ended, or aborted by
//     a statement that failed outside a savepoint) the transaction is rolled back and the
//     batch read again at once in a new one, its acked messages included (their offset and
//     writes went down with it). Nothing is acked that did not commit.
//     It is such a long transaction: while one message is being nacked, rows committed after
//     that transaction began stay invisible to every SQL-broker subscriber on the server, not
//     only to its group (the outbox relay is not held back). Park poison messages (middleware Stack) rather than
//     nacking them for long.
//   - Each subscription holds one pool connection while it reads and delivers a batch, and
//     members of one group waiting for the group's lock hold one each: size the pool above the
//     number of SQL subscriptions in the process plus what handlers, publishers and the relay
//     use at the same moment.
//   - Positions and row order are transaction ids of the cluster that wrote them. After a
//     restore into a cluster with a lower transaction counter the subscriptions receive nothing
//     until rebased: an idle subscription logs ErrSQLTopicsMoved at ERROR (CheckSQLTopics
//     reports a schema), and RebaseSQLTopics (wmonce rebase -broker-schema) makes each group
//     read again exactly what it had not provably consumed. A restore into a higher counter, or
//     pg_upgrade, needs nothing (docs/brokers.md, "SQL: after a backup and restore").
package broker
