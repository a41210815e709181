package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/eapache/go-resiliency/breaker"

	"github.com/wmonce/watermill-once/internal/worker"
)

// KafkaProtocolVersion is the Kafka protocol version Sarama speaks (sarama.Config.Version) to
// every Kafka target: Apache Kafka 3.9 and 4.x and the embedded kfake broker alike, so the
// protocol the tests exercise on kfake is the one production uses.
//
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
const KafkaProtocolVersion = "2.1.0"

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

func (b *Broker) newKafkaPublisher() (message.Publisher, error) {
	newPub := func() (message.Publisher, error) {
		return kafka.NewPublisher(kafka.PublisherConfig{
			Brokers:               b.config.Kafka.Brokers,
			Marshaler:             b.kafkaMarshaler(),
			OverwriteSaramaConfig: b.saramaConfig(),
		}, b.logger)
	}
	pub, err := newPub()
	if err != nil {
		return nil, err
	}
	return &kafkaPublisher{pub: pub, newPub: newPub, backoff: 100 * time.Millisecond, timeout: kafkaPublishRetryTimeout}, nil
}

// kafkaPublishRetryTimeout bounds how long one message is retried on a leaderless partition.
const kafkaPublishRetryTimeout = 30 * time.Second // beyond Sarama's 10 s breaker

// kafkaPublisher publishes one message at a time (as watermill-kafka does) and retries a
// message while its partition has no leader, with backoff. Sarama retries a batch
// Producer.Retry.Max times (with Producer.Retry.Backoff between attempts since v1.49; before,
// the idempotent producer did not wait at all), does not retry a failed leader lookup, and
// after three failed lookups opens a circuit breaker that refuses the partition for 10 s; so a
// partition that is briefly leaderless could fail the publish within milliseconds: seen on Kafka
// 3.9 just after the topic was created (the broker answers metadata before it leads the new
// partition) and after a broker restart. Copies a retry could create are the middleware's job, as for every
// broker; a message that still fails after kafkaPublishRetryTimeout returns the error.
//
// After OUT_OF_ORDER_SEQUENCE_NUMBER the producer is replaced: its idempotence state (producer
// id, sequence numbers) no longer matches the broker's. In CI, watermill's
// TestConcurrentSubscribeMultipleTopics saw a message fail with that error and, published again
// through the same producer, reported as sent but never delivered. A new producer has a new
// producer id, so publishing again really writes the message. The old producer is closed with
// the publisher (closing it now could race with concurrent sends on it).
type kafkaPublisher struct {
	mu      sync.RWMutex
	pub     message.Publisher
	retired []message.Publisher
	newPub  func() (message.Publisher, error)
	backoff time.Duration
	timeout time.Duration
}

func (p *kafkaPublisher) current() message.Publisher {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.pub
}

// renew replaces failed by a new producer, unless a concurrent call already did.
func (p *kafkaPublisher) renew(failed message.Publisher) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pub != failed {
		return nil
	}
	pub, err := p.newPub()
	if err != nil {
		return err
	}
	p.retired = append(p.retired, p.pub)
	p.pub = pub
	return nil
}

func (p *kafkaPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		deadline := time.Now().Add(p.timeout)
		backoff := worker.Backoff{Base: p.backoff, Max: time.Second}
		for {
			pub := p.current()
			err := pub.Publish(topic, msg)
			if err == nil {
				break
			}
			if errors.Is(err, sarama.ErrOutOfOrderSequenceNumber) {
				if rerr := p.renew(pub); rerr != nil {
					return errors.Join(err, fmt.Errorf("broker: new Kafka producer: %w", rerr))
				}
				return err // the caller publishes it again, through the new producer
			}
			wait := backoff.Next()
			if !leaderless(err) || time.Now().Add(wait).After(deadline) {
				return err
			}
			if !worker.Sleep(msg.Context(), wait) {
				return fmt.Errorf("%w (gave up: %w)", err, msg.Context().Err())
			}
		}
	}
	return nil
}

func (p *kafkaPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	errs := []error{p.pub.Close()}
	for _, r := range p.retired {
		errs = append(errs, r.Close())
	}
	return errors.Join(errs...)
}

// leaderless reports errors that mean "this partition has no usable leader right now": the
// ones Sarama itself retries, except a corrupt message, and Sarama's open circuit breaker
// around leader and partition lookups.
func leaderless(err error) bool {
	for _, e := range []error{sarama.ErrNotLeaderForPartition, sarama.ErrLeaderNotAvailable, sarama.ErrUnknownTopicOrPartition,
		sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend, sarama.ErrRequestTimedOut, sarama.ErrKafkaStorageError,
		breaker.ErrBreakerOpen} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (b *Broker) newKafkaSubscriber(group string) (message.Subscriber, error) {
	return kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               b.config.Kafka.Brokers,
		Unmarshaler:           b.kafkaMarshaler(),
		OverwriteSaramaConfig: b.saramaConfig(),
		ConsumerGroup:         group,
		NackResendSleep:       b.config.Kafka.NackResendSleep,
		ReconnectRetrySleep:   time.Second,
	}, b.logger)
}

// ensureKafkaTopic creates a topic with the configured partitions and replication factor; a
// topic that already exists is left as it is.
func (b *Broker) ensureKafkaTopic(ctx context.Context, topic string) error {
	b.kafkaMu.Lock()
	defer b.kafkaMu.Unlock()
	var created bool
	err := b.withKafkaAdmin(ctx, func(admin sarama.ClusterAdmin) error {
		err := admin.CreateTopic(topic, &sarama.TopicDetail{
			NumPartitions:     b.config.Kafka.Partitions,
			ReplicationFactor: b.config.Kafka.ReplicationFactor,
		}, false)
		created = err == nil
		if errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return nil // made by someone else, or by an attempt of ours whose answer was lost
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("broker: create Kafka topic %q: %w", topic, err)
	}
	if created {
		b.kafkaMade = append(b.kafkaMade, topic)
		b.logger.Info("Created Kafka topic", map[string]any{"topic": topic, "partitions": b.config.Kafka.Partitions})
	}
	return nil
}

// withKafkaAdmin runs fn with the admin client (b.kafkaMu held). When fn fails without an
// answer from the cluster (the connection broke, no broker answers), it replaces the admin
// client by a new one and tries again, with backoff, until ctx ends: a Sarama Broker never
// reconnects a connection that failed, so after the broker restarts (a crash, a rolling
// upgrade) the long-lived admin client would fail every request with EOF or "broken pipe"
// until it is replaced. An answer from the cluster (a Kafka error code) is returned as it is.
func (b *Broker) withKafkaAdmin(ctx context.Context, fn func(sarama.ClusterAdmin) error) error {
	backoff := 100 * time.Millisecond
	for {
		if b.kafkaAdmin == nil {
			return errors.New("broker: Kafka admin client is closed")
		}
		err := fn(b.kafkaAdmin)
		var answered sarama.KError
		if err == nil || errors.As(err, &answered) {
			return err
		}
		b.logger.Info("Kafka admin request failed without an answer from the cluster; reconnecting", map[string]any{"err": err.Error()})
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up reconnecting: %w)", err, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
		fresh, nerr := sarama.NewClusterAdmin(b.config.Kafka.Brokers, b.saramaConfig())
		if nerr != nil {
			continue // the cluster is still unreachable: the next attempt fails fast and waits again
		}
		_ = b.kafkaAdmin.Close()
		b.kafkaAdmin = fresh
	}
}

// CreatedKafkaTopics returns the topics this Broker created (not those it found existing), for
// tests and demos that delete their throw-away topics (DeleteKafkaTopics).
func (b *Broker) CreatedKafkaTopics() []string {
	b.kafkaMu.Lock()
	defer b.kafkaMu.Unlock()
	return append([]string(nil), b.kafkaMade...)
}

// DeleteKafkaTopics deletes topics (for tests and demos that create throw-away topics).
func (b *Broker) DeleteKafkaTopics(topics ...string) error {
	b.kafkaMu.Lock()
	defer b.kafkaMu.Unlock()
	if b.config.Kind != Kafka {
		return errors.New("broker: not a Kafka broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), declareTimeout)
	defer cancel()
	var errs []error
	for _, t := range topics {
		err := b.withKafkaAdmin(ctx, func(admin sarama.ClusterAdmin) error {
			if err := admin.DeleteTopic(t); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
				return err
			}
			return nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("delete Kafka topic %q: %w", t, err))
		}
	}
	return errors.Join(errs...)
}
