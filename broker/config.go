package broker

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// Kind names a broker implementation.
type Kind string

// The supported brokers.
const (
	// SQL is Watermill's SQL Pub/Sub on PostgreSQL: topics are tables, consumer groups are rows
	// of an offsets table. Needs nothing but the database.
	SQL Kind = "sql"
	// Kafka is Apache Kafka (or anything speaking its protocol, such as Redpanda or the
	// embedded kfake broker) through Watermill's Sarama-based Pub/Sub.
	Kafka Kind = "kafka"
	// AMQP is RabbitMQ (AMQP 0-9-1) through Watermill's AMQP Pub/Sub.
	AMQP Kind = "amqp"
)

// Kinds lists the supported brokers.
var Kinds = []Kind{SQL, Kafka, AMQP}

// Environment variables read by ConfigFromEnv and written by Config.Environ.
const (
	EnvBroker            = "BROKER"
	EnvDatabaseURL       = "DATABASE_URL"
	EnvSQLSchema         = "BROKER_SQL_SCHEMA"
	EnvSQLWatermill      = "BROKER_SQL_WATERMILL"
	EnvKafkaBrokers      = "KAFKA_BROKERS"
	EnvKafkaPartitions   = "KAFKA_PARTITIONS"
	EnvKafkaReplication  = "KAFKA_REPLICATION_FACTOR"
	EnvKafkaPartitionKey = "KAFKA_PARTITION_KEY"
	EnvKafkaSession      = "KAFKA_SESSION_TIMEOUT"
	EnvAMQPURL           = "AMQP_URL"
	EnvAMQPPrefix        = "AMQP_PREFIX"
	EnvAMQPQueueType     = "AMQP_QUEUE_TYPE"
)

// Defaults.
const (
	DefaultSQLSchema         = "wmonce_broker"
	DefaultWatermillSQL      = 4
	DefaultKafkaPartitions   = 3
	DefaultPartitionKeyField = "partition_key"
	DefaultAMQPURL           = "amqp://guest:guest@127.0.0.1:5672/"
	// DefaultNackDelay is every broker's wait before a nacked message is delivered again
	// (SQL.NackDelay, Kafka.NackDelay, AMQP.NackDelay).
	DefaultNackDelay = 100 * time.Millisecond
	QueueTypeQuorum  = "quorum"
	QueueTypeClassic = "classic"
)

// Config chooses a broker and how to reach it. The zero value plus DatabaseURL is a working SQL
// broker; ConfigFromEnv fills it from the environment.
type Config struct {
	// Kind is the broker. Env BROKER; default SQL.
	Kind Kind
	// DatabaseURL is used by the SQL broker when New is given no *sql.DB. Env DATABASE_URL;
	// default pgtx.DefaultDatabaseURL.
	DatabaseURL string
	// Subscriptions are the (topic, consumer group) pairs declared before anything is
	// published. NewPublisher declares them (RabbitMQ queues and bindings, Kafka topics, SQL
	// tables and group offsets); Declare does it on demand. They are not needed for a group
	// to receive what was published before it first subscribed, on any broker; on RabbitMQ
	// they are needed for each of several groups of one topic to receive it (see Declare).
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

// SQLConfig configures Watermill's SQL Pub/Sub.
type SQLConfig struct {
	// WatermillSQL is the major version of watermill-sql the SQL broker runs on: 3
	// (github.com/ThreeDotsLabs/watermill-sql/v3) or 4 (.../v4, over database/sql). Both read
	// and write the same topic and offsets tables with the same queries, so publishers and
	// subscribers of either version share a schema and a consumer group moves from one to the
	// other where it stopped. It decides which watermill-sql TxFromContext finds the
	// subscriber's transaction in a message context (pgtx.SubscriberTxFromContext finds
	// either). Env BROKER_SQL_WATERMILL ("3" or "4"); default 4, the version Watermill's
	// examples use.
	WatermillSQL int
	// Schema holds the topic tables (watermill_<topic>, watermill_offsets_<topic>); created if
	// missing. Env BROKER_SQL_SCHEMA; default "wmonce_broker".
	Schema string
	// PollInterval is the wait after a query that found nothing when wake-ups are off
	// (DisableListen, a pool whose driver is not pgx) or the LISTEN connection is down; it also
	// caps the re-check backoff (at most 1s) while a notified row is hidden by an older open
	// transaction. Default 100ms.
	PollInterval time.Duration
	// IdlePollInterval is the wait after a query that found nothing while wake-ups work: a
	// subscription queries again when a row is inserted into its topic table (LISTEN/NOTIFY,
	// see NotifyChannel), or after IdlePollInterval if none was. An idle subscription costs one
	// BEGIN/SELECT/COMMIT (and a liveness ping of the pool connection) per IdlePollInterval. Default 3s.
	IdlePollInterval time.Duration
	// DisableListen turns wake-ups off: no LISTEN connection, subscriptions poll every
	// PollInterval (watermill-sql's behaviour). The topic tables get their notify trigger
	// anyway, so other processes sharing the schema can use wake-ups. Each insert into a topic
	// table notifies (one pg_notify per statement, delivered at commit); PostgreSQL serialises
	// the commits of notifying transactions on one server-wide lock, which costs throughput
	// only at thousands of publishing commits per second.
	DisableListen bool
	// BatchSize is how many rows the subscriber reads per transaction. The effectively-once
	// middleware applies each of them in a savepoint of that transaction, so a crash rolls
	// the whole batch back (nothing is lost or half-applied) and a larger batch only means more
	// redone work after a crash. Default 10.
	BatchSize int
	// AckDeadline nacks a message whose handler has not finished in time; keep it above your
	// slowest handler. A nacked message is re-sent in the subscription's transaction until
	// then, unless that transaction can no longer commit (a lost connection): then the batch
	// is read again at once in a new one (see the package documentation). Default 30s.
	AckDeadline time.Duration
	// NackDelay is the wait before a nacked message is delivered again (in the subscription's
	// transaction). Default DefaultNackDelay (100ms).
	NackDelay time.Duration
}

// KafkaConfig configures Watermill's Kafka Pub/Sub (Sarama).
type KafkaConfig struct {
	// Brokers are the bootstrap addresses. Env KAFKA_BROKERS (comma-separated). Required; when
	// empty, the demo starts an in-process broker (tests and the demo only).
	Brokers []string
	// Partitions for topics this package creates. Env KAFKA_PARTITIONS; default 3.
	Partitions int32
	// ReplicationFactor for topics this package creates; -1 asks the cluster for its
	// default.replication.factor. Env KAFKA_REPLICATION_FACTOR; default -1.
	ReplicationFactor int16
	// PartitionKeyField is the metadata field whose value is the Kafka record key, so every
	// message with the same value lands in the same partition, in order. A message without it
	// is keyed by its UUID (all copies of one event still share a partition). Env
	// KAFKA_PARTITION_KEY; default "partition_key".
	PartitionKeyField string
	// RequirePartitionKey refuses to publish a message without PartitionKeyField instead of
	// falling back to its UUID.
	RequirePartitionKey bool
	// ClientID identifies this client to the brokers. Default "watermill-once".
	ClientID string
	// SessionTimeout is how long the group coordinator waits for a silent consumer (a crashed
	// process) before giving its partitions to another member. Default 10s; the cluster
	// refuses values outside group.min/max.session.timeout.ms (by default 6s to 5min). Env
	// KAFKA_SESSION_TIMEOUT (a Go duration such as 10s).
	SessionTimeout time.Duration
	// NackDelay is the wait before a nacked message is delivered again. Default DefaultNackDelay
	// (100ms).
	NackDelay time.Duration
}

// AMQPConfig configures Watermill's AMQP Pub/Sub for RabbitMQ.
type AMQPConfig struct {
	// URL of the broker, vhost included. Env AMQP_URL; default amqp://guest:guest@127.0.0.1:5672/.
	URL string
	// Prefix is put in front of every exchange and queue name this package declares, so several
	// applications (or test runs) can share a vhost. Env AMQP_PREFIX; default "".
	Prefix string
	// QueueType is "quorum" (replicated, durable; RabbitMQ's recommended type since 3.8) or
	// "classic". Env AMQP_QUEUE_TYPE; default "quorum". An existing queue keeps the type it was
	// declared with; declaring it with another type fails with PRECONDITION_FAILED.
	QueueType string
	// Workers is how many goroutines each subscription (each Subscribe call) runs, one message
	// in flight each: a router handler runs that many messages at once (with the
	// effectively-once middleware, each holds a pool connection). Default 8. Set 1 for one
	// message at a time in queue order (see Prefetch for what still reorders then).
	Workers int
	// Prefetch is how many unacknowledged messages RabbitMQ hands each subscription: the ones
	// in flight plus the ones waiting in this process, so the next message is here when one is
	// acked instead of a round trip later. Everything prefetched is redelivered if the consumer
	// dies. Default 4 x Workers (32); at least Workers.
	//
	// Ordering: with Workers > 1, messages of one queue are handled at the same time and
	// finish in any order. With Prefetch > 1 (even at Workers 1), a nacked or unacked
	// message is requeued and delivered again after messages that were behind it. Consumers
	// that need per-key order must not rely on the queue for it (the effectively-once
	// middleware guarantees one effect per message, not order; use versions).
	Prefetch int
	// NackDelay is the wait before a nacked message is handed back to RabbitMQ, which requeues
	// it at once. Default DefaultNackDelay (100ms).
	NackDelay time.Duration
	// ConnectionName is shown in the management UI and rabbitmqctl. Default "watermill-once".
	ConnectionName string
	// DisableUnroutedQueue stops declaring the alternate exchange and queue
	// <Prefix>wmonce.unrouted, where RabbitMQ puts messages published to a topic that no queue
	// is bound to (instead of dropping them). Only disable it if the exchanges already exist
	// without the alternate-exchange argument.
	DisableUnroutedQueue bool
}

func (c *Config) setDefaults() {
	if c.Kind == "" {
		c.Kind = SQL
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = pgtx.DefaultDatabaseURL
	}
	s := &c.SQL
	if s.Schema == "" {
		s.Schema = DefaultSQLSchema
	}
	if s.WatermillSQL == 0 {
		s.WatermillSQL = DefaultWatermillSQL
	}
	if s.PollInterval == 0 {
		s.PollInterval = 100 * time.Millisecond
	}
	if s.IdlePollInterval == 0 {
		s.IdlePollInterval = 3 * time.Second
	}
	if s.BatchSize == 0 {
		s.BatchSize = 10
	}
	if s.AckDeadline == 0 {
		s.AckDeadline = 30 * time.Second
	}
	if s.NackDelay == 0 {
		s.NackDelay = DefaultNackDelay
	}
	k := &c.Kafka
	if k.Partitions == 0 {
		k.Partitions = DefaultKafkaPartitions
	}
	if k.ReplicationFactor == 0 {
		k.ReplicationFactor = -1
	}
	if k.PartitionKeyField == "" {
		k.PartitionKeyField = DefaultPartitionKeyField
	}
	if k.ClientID == "" {
		k.ClientID = "watermill-once"
	}
	if k.SessionTimeout == 0 {
		k.SessionTimeout = 10 * time.Second
	}
	if k.NackDelay == 0 {
		k.NackDelay = DefaultNackDelay
	}
	a := &c.AMQP
	if a.URL == "" {
		a.URL = DefaultAMQPURL
	}
	if a.QueueType == "" {
		a.QueueType = QueueTypeQuorum
	}
	if a.Workers == 0 {
		a.Workers = 8
	}
	if a.Prefetch == 0 {
		a.Prefetch = 4 * a.Workers
	}
	if a.NackDelay == 0 {
		a.NackDelay = DefaultNackDelay
	}
	if a.ConnectionName == "" {
		a.ConnectionName = "watermill-once"
	}
}

// Validate reports everything that is wrong with the configuration of the chosen Kind at once.
// Settings of the other kinds are not checked.
func (c Config) Validate() error {
	var errs []error
	if !slices.Contains(Kinds, c.Kind) {
		errs = append(errs, fmt.Errorf("broker kind %q is not supported: use %s=sql, kafka or amqp", c.Kind, EnvBroker))
	}
	for _, s := range c.Subscriptions {
		if err := ValidateTopic(c.Kind, s.Topic); err != nil {
			errs = append(errs, fmt.Errorf("subscription %+v: %w", s, err))
		}
		if err := ValidateGroup(s.Group); err != nil {
			errs = append(errs, fmt.Errorf("subscription %+v: %w", s, err))
		}
	}
	switch c.Kind {
	case SQL:
		s := c.SQL
		if err := pgtx.ValidateIdentifier("SQL broker schema ("+EnvSQLSchema+")", s.Schema); err != nil {
			errs = append(errs, err)
		}
		if s.WatermillSQL != 3 && s.WatermillSQL != 4 {
			errs = append(errs, fmt.Errorf("SQL.WatermillSQL (%s) is the watermill-sql major version and must be 3 or 4, got %d", EnvSQLWatermill, s.WatermillSQL))
		}
		if s.BatchSize < 1 || s.BatchSize > 1000 {
			errs = append(errs, fmt.Errorf("SQL.BatchSize must be between 1 and 1000, got %d", s.BatchSize))
		}
		if s.PollInterval < 0 || s.IdlePollInterval < 0 || s.AckDeadline < 0 || s.NackDelay < 0 {
			errs = append(errs, errors.New("SQL.PollInterval, IdlePollInterval, AckDeadline and NackDelay must be positive"))
		}
	case Kafka:
		k := c.Kafka
		if len(k.Brokers) == 0 {
			errs = append(errs, fmt.Errorf("no Kafka brokers: set %s (host:port[,host:port...]) or point it at a running cluster", EnvKafkaBrokers))
		}
		for _, b := range k.Brokers {
			if b == "" || strings.ContainsAny(b, " /") || !strings.Contains(b, ":") {
				errs = append(errs, fmt.Errorf("Kafka broker address %q is not host:port", b))
			}
		}
		if k.Partitions < 1 {
			errs = append(errs, fmt.Errorf("Kafka.Partitions (%s) must be at least 1, got %d", EnvKafkaPartitions, k.Partitions))
		}
		if k.ReplicationFactor < -1 || k.ReplicationFactor == 0 {
			errs = append(errs, fmt.Errorf("Kafka.ReplicationFactor (%s) must be -1 (cluster default) or at least 1, got %d", EnvKafkaReplication, k.ReplicationFactor))
		}
		if strings.TrimSpace(k.PartitionKeyField) != k.PartitionKeyField {
			errs = append(errs, fmt.Errorf("Kafka.PartitionKeyField %q has surrounding spaces", k.PartitionKeyField))
		}
		if k.SessionTimeout < time.Second || k.NackDelay < 0 {
			errs = append(errs, errors.New("Kafka.SessionTimeout must be at least 1s and NackDelay not negative"))
		}
	case AMQP:
		a := c.AMQP
		u, err := url.Parse(a.URL)
		if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
			errs = append(errs, fmt.Errorf("AMQP URL (%s) must look like amqp://user:pass@host:5672/vhost", EnvAMQPURL))
		}
		if a.QueueType != QueueTypeQuorum && a.QueueType != QueueTypeClassic {
			errs = append(errs, fmt.Errorf("AMQP queue type (%s) %q is not supported: use quorum or classic", EnvAMQPQueueType, a.QueueType))
		}
		if a.Prefix != "" && !amqpName.MatchString(a.Prefix) {
			errs = append(errs, fmt.Errorf("AMQP prefix (%s) %q may only hold letters, digits, '-', '_', '.' and ':'", EnvAMQPPrefix, a.Prefix))
		}
		if a.Workers < 1 || a.Workers > 1000 {
			errs = append(errs, fmt.Errorf("AMQP.Workers must be between 1 and 1000, got %d", a.Workers))
		}
		if a.Prefetch < a.Workers || a.Prefetch > 65535 {
			errs = append(errs, fmt.Errorf("AMQP.Prefetch must be between Workers (%d) and 65535, got %d: fewer would leave consumers idle", a.Workers, a.Prefetch))
		}
		if a.NackDelay < 0 {
			errs = append(errs, errors.New("AMQP.NackDelay must not be negative"))
		}
	}
	return errors.Join(errs...)
}

// ConfigFromEnv reads the configuration from the process environment; see ParseEnv.
func ConfigFromEnv() (Config, error) { return ParseEnv(os.Getenv) }

// ParseEnv reads BROKER, DATABASE_URL, BROKER_SQL_SCHEMA, BROKER_SQL_WATERMILL, KAFKA_BROKERS,
// KAFKA_PARTITIONS, KAFKA_REPLICATION_FACTOR, KAFKA_PARTITION_KEY, KAFKA_SESSION_TIMEOUT,
// AMQP_URL, AMQP_PREFIX and AMQP_QUEUE_TYPE through getenv, applies the defaults and validates
// the result. Unset variables keep their defaults; a malformed one is an error naming it.
func ParseEnv(getenv func(string) string) (Config, error) {
	var c Config
	var errs []error
	c.Kind = Kind(strings.ToLower(strings.TrimSpace(getenv(EnvBroker))))
	c.DatabaseURL = getenv(EnvDatabaseURL)
	c.SQL.Schema = getenv(EnvSQLSchema)
	if v := getenv(EnvSQLWatermill); v != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(strings.ToLower(strings.TrimSpace(v)), "v"))
		if err != nil || (n != 3 && n != 4) {
			errs = append(errs, fmt.Errorf("%s=%q: want the watermill-sql major version, 3 or 4", EnvSQLWatermill, v))
		}
		c.SQL.WatermillSQL = n
	}
	if v := getenv(EnvKafkaBrokers); strings.TrimSpace(v) != "" {
		for _, b := range strings.Split(v, ",") {
			c.Kafka.Brokers = append(c.Kafka.Brokers, strings.TrimSpace(b))
		}
	}
	if v := getenv(EnvKafkaPartitions); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("%s=%q: want a number of partitions, at least 1", EnvKafkaPartitions, v))
		}
		c.Kafka.Partitions = int32(n)
	}
	if v := getenv(EnvKafkaReplication); v != "" {
		n, err := strconv.ParseInt(v, 10, 16)
		if err != nil || n == 0 || n < -1 {
			errs = append(errs, fmt.Errorf("%s=%q: want -1 (cluster default) or at least 1", EnvKafkaReplication, v))
		}
		c.Kafka.ReplicationFactor = int16(n)
	}
	c.Kafka.PartitionKeyField = getenv(EnvKafkaPartitionKey)
	if v := getenv(EnvKafkaSession); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration of at least 1s, e.g. 10s", EnvKafkaSession, v))
		}
		c.Kafka.SessionTimeout = d
	}
	c.AMQP.URL = getenv(EnvAMQPURL)
	c.AMQP.Prefix = getenv(EnvAMQPPrefix)
	c.AMQP.QueueType = strings.ToLower(getenv(EnvAMQPQueueType))
	if len(errs) > 0 {
		return Config{}, fmt.Errorf("broker: invalid environment: %w", errors.Join(errs...))
	}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("broker: invalid configuration from the environment: %w", err)
	}
	return c, nil
}

// Environ returns the configuration as the environment variables ParseEnv reads ("KEY=value"),
// for handing it to a child process. Settings without a variable (Subscriptions, timings) are
// not included.
func (c Config) Environ() []string {
	c.setDefaults()
	env := []string{
		EnvBroker + "=" + string(c.Kind),
		EnvDatabaseURL + "=" + c.DatabaseURL,
		EnvSQLSchema + "=" + c.SQL.Schema,
		EnvSQLWatermill + "=" + strconv.Itoa(c.SQL.WatermillSQL),
		EnvKafkaPartitions + "=" + strconv.Itoa(int(c.Kafka.Partitions)),
		EnvKafkaReplication + "=" + strconv.Itoa(int(c.Kafka.ReplicationFactor)),
		EnvKafkaPartitionKey + "=" + c.Kafka.PartitionKeyField,
		EnvKafkaSession + "=" + c.Kafka.SessionTimeout.String(),
		EnvAMQPURL + "=" + c.AMQP.URL,
		EnvAMQPPrefix + "=" + c.AMQP.Prefix,
		EnvAMQPQueueType + "=" + c.AMQP.QueueType,
	}
	if len(c.Kafka.Brokers) > 0 {
		env = append(env, EnvKafkaBrokers+"="+strings.Join(c.Kafka.Brokers, ","))
	}
	return env
}

// Topic and group name rules. SQL topics become table names ("watermill_offsets_" + topic must
// fit PostgreSQL's 63 bytes), Kafka allows [a-zA-Z0-9._-] up to 249 bytes, and RabbitMQ
// exchange and queue names allow letters, digits, '-', '_', '.', ':' up to 255 bytes.
var (
	sqlTopic   = regexp.MustCompile(`^[A-Za-z0-9\-$:._]{1,45}$`)
	kafkaTopic = regexp.MustCompile(`^[A-Za-z0-9._\-]{1,249}$`)
	amqpName   = regexp.MustCompile(`^[A-Za-z0-9\-_.:]{1,200}$`)
	groupName  = regexp.MustCompile(`^[A-Za-z0-9\-_.]{1,100}$`)
)

// ValidateTopic checks that topic can be carried by the broker kind, with an error saying
// what is allowed. Pass TopicValidator(kind) as outbox.Config.ValidateTopic so that a topic
// the broker would refuse fails the producing transaction instead of blocking the relay.
func ValidateTopic(kind Kind, topic string) error {
	switch kind {
	case SQL:
		if !sqlTopic.MatchString(topic) {
			return fmt.Errorf("topic %q is not valid for the SQL broker: use 1-45 characters from A-Z a-z 0-9 - $ : . _", topic)
		}
	case Kafka:
		if !kafkaTopic.MatchString(topic) || topic == "." || topic == ".." {
			return fmt.Errorf("topic %q is not valid for Kafka: use 1-249 characters from A-Z a-z 0-9 . _ -", topic)
		}
	case AMQP:
		if !amqpName.MatchString(topic) || strings.HasPrefix(topic, "amq.") {
			return fmt.Errorf("topic %q is not valid for RabbitMQ: use 1-200 characters from A-Z a-z 0-9 - _ . : not starting with \"amq.\"", topic)
		}
	default:
		return fmt.Errorf("unknown broker kind %q", kind)
	}
	return nil
}

// TopicValidator returns ValidateTopic for kind, in the shape of outbox.Config.ValidateTopic.
func TopicValidator(kind Kind) func(topic string) error {
	return func(topic string) error { return ValidateTopic(kind, topic) }
}

// ValidateGroup checks a consumer group name: 1-100 characters from A-Z a-z 0-9 - _ .
// A colon is refused because the RabbitMQ queue name is <topic>:<group>, which must not be
// ambiguous.
func ValidateGroup(group string) error {
	if !groupName.MatchString(group) {
		return fmt.Errorf("consumer group %q is not valid: use 1-100 characters from A-Z a-z 0-9 - _ .", group)
	}
	return nil
}
