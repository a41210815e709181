package broker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/pgtx"
)

// declareTimeout bounds each declaration (topic table, Kafka topic, RabbitMQ queue).
const declareTimeout = 30 * time.Second

// Broker builds publishers and subscribers for the configured broker kind and declares the
// topics, queues and tables they need (guarantees: the package doc). Safe for concurrent use.
type Broker struct {
	config Config
	db     *sql.DB
	ownDB  bool
	logger watermill.LoggerAdapter

	sql *sqlBroker

	kafkaMu    sync.Mutex
	kafkaAdmin sarama.ClusterAdmin
	kafkaMade  []string // topics this Broker created, in order (CreatedKafkaTopics)

	declared  sync.Map   // declaration key -> struct{}
	rerouteMu sync.Mutex // one rerouteUnrouted pass at a time
	closeOnce sync.Once

	testSignals brokerTestSignals
}

// brokerTestSignals are the events this package's tests wait on instead of polling the database
// (see internal/testsignal): inert unless a test initialised them through export_test.go.
type brokerTestSignals struct {
	// SQLBatchCommit carries the consumer group of a SQL subscription that acked rows of a
	// batch and then ran COMMIT on the batch's transaction, which moves the group's offset
	// unless it fails (a doomed transaction; watermill-sql only logs that).
	SQLBatchCommit testsignal.Signal[string]
	// SQLMoveDetected carries the topic of a SQL subscription that found rows or its group's
	// position ahead of the cluster's transaction counter (and logged it, rate-limited).
	SQLMoveDetected testsignal.Signal[string]
}

// New validates config and checks that the broker can be reached. The SQL broker uses db (nil:
// a pool opened from config.DatabaseURL, closed by Close); Kafka and RabbitMQ ignore it.
func New(ctx context.Context, db *sql.DB, config Config, logger watermill.LoggerAdapter) (*Broker, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("broker: invalid config: %w", err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	b := &Broker{config: config, logger: logger.With(watermill.LogFields{"broker": string(config.Kind)})}
	if err := b.connect(ctx, db); err != nil {
		return nil, err
	}
	return b, nil
}

// connect checks that the configured broker can be reached and opens what the Broker keeps.
func (b *Broker) connect(ctx context.Context, db *sql.DB) error {
	switch b.config.Kind {
	case SQL:
		return b.connectSQL(ctx, db)
	case Kafka:
		admin, err := sarama.NewClusterAdmin(b.config.Kafka.Brokers, b.saramaConfig())
		if err != nil {
			return fmt.Errorf("broker: cannot reach Kafka at %v (is it running? set %s): %w", b.config.Kafka.Brokers, EnvKafkaBrokers, err)
		}
		b.kafkaAdmin = admin
		return nil
	}
	return b.withAMQPChannel(b.declareUnrouted)
}

// connectSQL sets up the SQL broker on db (nil: a pool of its own from Config.DatabaseURL) and
// creates its schema; on failure it closes what it opened.
func (b *Broker) connectSQL(ctx context.Context, db *sql.DB) error {
	if db == nil {
		var err error
		if db, err = pgtx.Open(ctx, b.config.DatabaseURL, pgtx.PoolConfig{}); err != nil {
			return fmt.Errorf("broker: sql: %w", err)
		}
		b.ownDB = true
	}
	b.db = db
	sb, err := newSQLBroker(db, b.config.SQL, b.logger, &b.testSignals.SQLBatchCommit, &b.testSignals.SQLMoveDetected)
	if err == nil {
		b.sql = sb
		err = b.sql.ensureSchema(ctx)
	}
	if err != nil {
		_ = b.Close()
	}
	return err
}

// Kind returns the configured broker kind.
func (b *Broker) Kind() Kind { return b.config.Kind }

// Config returns the configuration with defaults applied.
func (b *Broker) Config() Config { return b.config }

// NewPublisher declares Config.Subscriptions and returns a publisher that checks each topic
// (TopicValidator) and declares it on first use. Close it when done.
func (b *Broker) NewPublisher(ctx context.Context) (message.Publisher, error) {
	if err := b.Declare(ctx, b.config.Subscriptions...); err != nil {
		return nil, err
	}
	var pub message.Publisher
	var err error
	switch b.config.Kind {
	case SQL:
		pub, err = b.sql.newPublisher(b.logger)
	case Kafka:
		pub, err = b.newKafkaPublisher()
	case AMQP:
		pub, err = b.newAMQPPublisher()
	}
	if err != nil {
		return nil, fmt.Errorf("broker: %s publisher: %w", b.config.Kind, err)
	}
	return &publisher{b: b, pub: pub}, nil
}

// NewSubscriber returns a subscriber of consumer group group: every group gets every message
// of a topic, its members share them. Subscribe declares first. Close it when done.
func (b *Broker) NewSubscriber(group string) (message.Subscriber, error) {
	if err := validateGroup(group); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	var sub message.Subscriber
	var err error
	switch b.config.Kind {
	case SQL:
		sub, err = b.sql.newSubscriber(group, b.logger)
	case Kafka:
		sub, err = b.newKafkaSubscriber(group)
	case AMQP:
		sub, err = b.newAMQPSubscriber(group)
	}
	if err != nil {
		return nil, fmt.Errorf("broker: %s subscriber: %w", b.config.Kind, err)
	}
	return &subscriber{b: b, group: group, sub: sub}, nil
}

// NewPubSub returns a publisher and a subscriber for group, the pair most programs need.
func (b *Broker) NewPubSub(ctx context.Context, group string) (message.Publisher, message.Subscriber, error) {
	pub, err := b.NewPublisher(ctx)
	if err != nil {
		return nil, nil, err
	}
	sub, err := b.NewSubscriber(group)
	if err != nil {
		_ = pub.Close()
		return nil, nil, err
	}
	return pub, sub, nil
}

// Declare makes each subscription exist (SQL tables and group offsets, Kafka topic, RabbitMQ
// exchange and queue), idempotently, so that what is published from now on reaches the group
// even if it subscribes later. Without it a late group still receives earlier messages, except
// on RabbitMQ for a topic's second and later groups: declare every group before publishing
// when each must receive everything (docs/brokers.md).
func (b *Broker) Declare(ctx context.Context, subs ...Subscription) error {
	for _, s := range subs {
		if err := validateTopic(b.config.Kind, s.Topic); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		if err := validateGroup(s.Group); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		if err := b.declare(ctx, s.Topic, s.Group); err != nil {
			return err
		}
	}
	return nil
}

// declare makes a topic (group == "") or a subscription exist, once per Broker.
func (b *Broker) declare(ctx context.Context, topic, group string) error {
	key := topic + "\x00" + group
	if _, ok := b.declared.Load(key); ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, declareTimeout)
	defer cancel()
	var err error
	switch b.config.Kind {
	case SQL:
		err = b.sql.declare(ctx, topic, group)
	case Kafka:
		err = b.ensureKafkaTopic(ctx, topic)
	case AMQP:
		err = b.declareAMQP(ctx, topic, group)
	}
	if err != nil {
		return err
	}
	b.declared.Store(key, struct{}{})
	return nil
}

// declareAMQP declares the topic's exchange (group == ""), or the group's queue bound to it and
// then sends the topic's unrouted messages to it.
func (b *Broker) declareAMQP(ctx context.Context, topic, group string) error {
	if group == "" {
		return b.withAMQPChannel(func(conn *amqp.Connection, ch amqpChannel) error { return b.declareExchange(conn, ch, topic) })
	}
	return b.withAMQPConn(func(conn *amqp.Connection) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("broker: open RabbitMQ channel: %w", err)
		}
		defer ch.Close()
		if err := b.declareQueue(conn, ch, topic, group); err != nil {
			return err
		}
		// Messages published to the topic while no queue was bound wait in the
		// unrouted queue: now there is one for them (see amqp_unrouted.go).
		return b.rerouteUnrouted(ctx, conn)
	})
}

// Close releases what New opened (Kafka admin connection, database pool), not publishers or
// subscribers. Idempotent.
func (b *Broker) Close() error {
	var errs []error
	b.closeOnce.Do(func() {
		b.kafkaMu.Lock()
		if b.kafkaAdmin != nil {
			errs = append(errs, b.kafkaAdmin.Close())
			b.kafkaAdmin = nil // closed: withKafkaAdmin must not replace it
		}
		b.kafkaMu.Unlock()
		if b.ownDB && b.db != nil {
			errs = append(errs, b.db.Close())
		}
	})
	return errors.Join(errs...)
}

// publisher validates and declares each topic before its first publish.
type publisher struct {
	b   *Broker
	pub message.Publisher
}

// Publish marks what can never be published as it is with wmonce.Permanent (a topic the
// broker cannot carry, a message it refuses: see IsPermanentPublishError), so that the outbox
// relay sets such a message aside instead of retrying it.
func (p *publisher) Publish(topic string, msgs ...*message.Message) error {
	if err := validateTopic(p.b.config.Kind, topic); err != nil {
		return wmonce.Permanent(fmt.Errorf("broker: %w", err))
	}
	if p.b.config.Kind == SQL {
		// watermill-sql stores metadata as JSON, which turns invalid UTF-8 into U+FFFD without
		// a word (and its uuid column is text): refuse what it would alter or reject.
		for _, m := range msgs {
			if err := sqlStorable(m); err != nil {
				return wmonce.Permanent(fmt.Errorf("broker: sql: message %q: %w", m.UUID, err))
			}
		}
	}
	if err := p.b.declare(context.Background(), topic, ""); err != nil {
		return permanentPublish(err)
	}
	return permanentPublish(p.pub.Publish(topic, msgs...))
}

func sqlStorable(m *message.Message) error {
	if err := setup.CheckText("UUID", m.UUID); err != nil {
		return err
	}
	for k, v := range m.Metadata {
		if err := setup.CheckText(fmt.Sprintf("metadata %.40q", k), k, v); err != nil {
			return fmt.Errorf("%w: the SQL broker stores metadata as JSON, which cannot carry it byte for byte", err)
		}
	}
	return nil
}

func (p *publisher) Close() error { return p.pub.Close() }

// subscriber declares the subscription before subscribing, so a topic nobody has published to
// yet, or a queue that does not exist yet, is not an error and loses nothing.
type subscriber struct {
	b     *Broker
	group string
	sub   message.Subscriber

	mu   sync.Mutex
	outs []<-chan *message.Message // returned by Subscribe, awaited by Close

	closeOnce sync.Once
	closeErr  error
}

func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.SubscribeInitialize(topic); err != nil {
		return nil, err
	}
	out, err := s.sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.outs = append(s.outs, out)
	s.mu.Unlock()
	return out, nil
}

// SubscribeInitialize declares the topic and this subscriber's group (message.SubscribeInitializer).
func (s *subscriber) SubscribeInitialize(topic string) error {
	return s.b.Declare(context.Background(), Subscription{Topic: topic, Group: s.group})
}

// Close closes the subscriber and returns once every channel Subscribe returned is closed, as
// Watermill's Pub/Sub contract (and its TestPubSub) expects: watermill-sql's Close returns when
// its consume loops have stopped, just before they close their channels. A stopped loop sends
// nothing more, so waiting here receives nothing but the close; anything else would be nacked.
//
// Close is idempotent and safe to call from several goroutines at once (a router closes a
// subscriber shared by several handlers once per handler; watermill-sql's own Close is not safe
// for that): every call returns after the first has finished.
func (s *subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.sub.Close()
		s.mu.Lock()
		outs := s.outs
		s.outs = nil
		s.mu.Unlock()
		for _, out := range outs {
			for msg := range out {
				msg.Nack()
			}
		}
	})
	return s.closeErr
}
