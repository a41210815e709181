package broker

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// Kind names a broker implementation.
type Kind string

// The supported brokers.
const (
	// SQL is Watermill's SQL Pub/Sub on PostgreSQL: needs nothing but the database.
	SQL Kind = "sql"
	// Kafka is Apache Kafka (or its protocol) through Watermill's Sarama-based Pub/Sub.
	Kafka Kind = "kafka"
	// AMQP is RabbitMQ (AMQP 0-9-1) through Watermill's AMQP Pub/Sub.
	AMQP Kind = "amqp"
)

// Kinds lists the supported brokers.
var Kinds = []Kind{SQL, Kafka, AMQP}

// Defaults shared by every broker. Each broker's own are beside its config (SQLConfig,
// KafkaConfig, AMQPConfig).
const (
	// defaultKind is the broker of a Config without a Kind: the one that needs nothing but
	// PostgreSQL.
	defaultKind = SQL
	// defaultNackDelay is every broker's wait before a nacked message is delivered again
	// (SQL.NackDelay, Kafka.NackDelay, AMQP.NackDelay).
	defaultNackDelay = 100 * time.Millisecond
)

// Config chooses a broker and how to reach it. The zero value plus DatabaseURL is a working SQL
// broker; ConfigFromEnv fills it from the environment.
type Config struct {
	// Kind is the broker. Env BROKER; default SQL.
	Kind Kind
	// DatabaseURL is used by the SQL broker when New is given no *sql.DB. Env DATABASE_URL;
	// default pgtx.DefaultDatabaseURL.
	DatabaseURL string
	// Subscriptions are the (topic, consumer group) pairs NewPublisher declares before anything
	// is published (see Declare).
	Subscriptions []Subscription

	SQL   SQLConfig
	Kafka KafkaConfig
	AMQP  AMQPConfig
}

// Subscription names one consumer group's subscription to one topic.
type Subscription struct {
	Topic string
	Group string
}

func (c *Config) setDefaults() {
	c.Kind = cmp.Or(c.Kind, defaultKind)
	c.DatabaseURL = cmp.Or(c.DatabaseURL, pgtx.DefaultDatabaseURL)
	c.SQL.setDefaults()
	c.Kafka.setDefaults()
	c.AMQP.setDefaults()
}

// Validate reports everything that is wrong with the configuration of the chosen Kind at once.
// Settings of the other kinds are not checked.
func (c Config) Validate() error {
	var errs []error
	if !slices.Contains(Kinds, c.Kind) {
		errs = append(errs, fmt.Errorf("broker kind %q is not supported: use %s=sql, kafka or amqp", c.Kind, EnvBroker))
	}
	for _, s := range c.Subscriptions {
		errs = append(errs, checkSubscription(c.Kind, s)...)
	}
	kindConfig := map[Kind]func() error{SQL: c.SQL.validate, Kafka: c.Kafka.validate, AMQP: c.AMQP.validate}
	if validate, ok := kindConfig[c.Kind]; ok {
		errs = append(errs, validate())
	}
	return errors.Join(errs...)
}

// checkSubscription refuses a topic the broker kind cannot carry and an unusable group name.
func checkSubscription(kind Kind, s Subscription) []error {
	var errs []error
	for _, err := range []error{validateTopic(kind, s.Topic), validateGroup(s.Group)} {
		if err != nil {
			errs = append(errs, fmt.Errorf("subscription %+v: %w", s, err))
		}
	}
	return errs
}
