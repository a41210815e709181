package broker

import (
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// KafkaProtocolVersion is the Kafka protocol version Sarama speaks (sarama.Config.Version) to
// every Kafka target: Apache Kafka 3.9 and 4.x and the embedded kfake broker alike
// (docs/brokers.md, "Kafka versions").
const KafkaProtocolVersion = "2.1.0"

// Why 2.1: it is the oldest protocol Kafka 4 still serves (KIP-896 removed the request
// versions older than Kafka 2.1's) and new enough for the idempotent producer (0.11+). Kafka
// 3.9.1 and 4.4.0 also pass this package's Kafka tests with Sarama's newest (3.6), but kfake
// does not: from 2.4 Sarama fetches group offsets with the flexible
// OffsetFetch v6+, whose decoder reads the partition metadata as a non-nullable string, while
// kfake (as the protocol schema allows) sends null for a partition without a committed offset,
// and Sarama fails every consumer group session with "error decoding packet: invalid
// byteslice length" (Kafka sends "" there). What a newer version would add here is unused:
// static membership (2.3), the ApiVersions handshake (2.4), epoch bumps through
// InitProducerId v3+ (2.5; Sarama's idempotent producer bumps its epoch locally at any version).
var kafkaProtocol = func() sarama.KafkaVersion {
	v, err := sarama.ParseKafkaVersion(KafkaProtocolVersion)
	if err != nil {
		panic(err)
	}
	return v
}()

// saramaConfig is one Sarama configuration for producing, consuming and administration, each
// setting chosen for durability over speed.
func (b *Broker) saramaConfig() *sarama.Config {
	k := b.config.Kafka
	c := sarama.NewConfig()
	// One protocol version for every target; see KafkaProtocolVersion.
	c.Version = kafkaProtocol
	c.ClientID = k.ClientID
	c.Metadata.Retry.Max = 10
	c.Metadata.Retry.Backoff = 250 * time.Millisecond

	// Producer: the broker assigns a producer id and drops the duplicates its own retries would
	// create (Idempotent), a send succeeds only once every in-sync replica has the record
	// (WaitForAll), and one request in flight keeps retries from reordering records.
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1
	c.Producer.Retry.Max = 10
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	// Records with the same key go to the same partition (hash of the key); the key is
	// PartitionKeyField, or the UUID (see partitionKey).
	c.Producer.Partitioner = sarama.NewHashPartitioner

	// Consumer: a group that has never committed starts from the oldest retained record, so
	// messages published before the first subscription are not skipped. Offsets are marked when
	// Watermill's message is acked and committed every second in the background: a crash
	// redelivers at most the last second of acked messages, which the middleware absorbs.
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.AutoCommit.Enable = true
	c.Consumer.Offsets.AutoCommit.Interval = time.Second
	c.Consumer.Return.Errors = true
	// Only records of committed Kafka transactions: Debezium's connector with exactly-once
	// source support (outbox/cdc) writes in transactions, and a worker that dies mid-transaction
	// leaves records that are aborted and written again. Sarama's default (read_uncommitted)
	// would hand both copies over, the aborted one first. Records of non-transactional
	// producers (the Relay's) are visible as soon as they are written, as before.
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	c.Consumer.Group.Session.Timeout = k.SessionTimeout
	c.Consumer.Group.Heartbeat.Interval = k.SessionTimeout / 3
	// The coordinator may hold a JoinGroup for up to the rebalance timeout (waiting for a
	// member that crashed mid-rebalance), but Sarama waits for the answer only Net.ReadTimeout.
	// With Sarama's defaults (60s vs 30s) the client times out first, Watermill reconnects as a
	// new member, the wait starts over, and the group never settles (seen with kfake after a
	// consumer was killed with SIGKILL). Keep the rebalance timeout below the read timeout.
	c.Net.ReadTimeout = 30 * time.Second
	c.Consumer.Group.Rebalance.Timeout = 20 * time.Second
	return c
}

// kafkaMarshaler is Watermill's marshaler (UUID in header _watermill_message_uuid, metadata as
// headers) with the record key taken from a metadata field.
func (b *Broker) kafkaMarshaler() kafka.MarshalerUnmarshaler {
	k := b.config.Kafka
	return kafka.NewWithPartitioningMarshaler(func(topic string, msg *message.Message) (string, error) {
		return partitionKey(k, msg)
	})
}

// partitionKey returns the record key: the PartitionKeyField metadata value, else the UUID (so
// every copy of one event lands in one partition), unless RequirePartitionKey refuses that.
func partitionKey(k KafkaConfig, msg *message.Message) (string, error) {
	if v := msg.Metadata.Get(k.PartitionKeyField); v != "" {
		return v, nil
	}
	if k.RequirePartitionKey {
		return "", fmt.Errorf("message %s has no %q metadata and Kafka.RequirePartitionKey is set", msg.UUID, k.PartitionKeyField)
	}
	if msg.UUID == "" {
		return "", fmt.Errorf("message has neither %q metadata nor a UUID to use as the Kafka key", k.PartitionKeyField)
	}
	return msg.UUID, nil
}

func (b *Broker) newKafkaSubscriber(group string) (message.Subscriber, error) {
	return kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               b.config.Kafka.Brokers,
		Unmarshaler:           KafkaUnmarshaler{Watermill: b.kafkaMarshaler()}, // Relay's and Debezium's records
		OverwriteSaramaConfig: b.saramaConfig(),
		ConsumerGroup:         group,
		NackResendSleep:       b.config.Kafka.NackDelay,
		ReconnectRetrySleep:   time.Second,
	}, b.logger)
}
