package broker

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

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
	EnvAMQPWorkers       = "AMQP_WORKERS"
	EnvAMQPPrefetch      = "AMQP_PREFETCH"
)

// ConfigFromEnv reads the configuration from the process environment; see ParseEnv.
func ConfigFromEnv() (Config, error) { return ParseEnv(os.Getenv) }

// ParseEnv reads BROKER, DATABASE_URL, BROKER_SQL_SCHEMA, BROKER_SQL_WATERMILL, KAFKA_BROKERS,
// KAFKA_PARTITIONS, KAFKA_REPLICATION_FACTOR, KAFKA_PARTITION_KEY, KAFKA_SESSION_TIMEOUT,
// AMQP_URL, AMQP_PREFIX, AMQP_QUEUE_TYPE, AMQP_WORKERS and AMQP_PREFETCH through getenv, applies the defaults and validates
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
	// Workers and Prefetch: ordered consumption (1 and 1) without code, and a variable named in
	// the error when a value is out of AMQPConfig's range.
	if v := getenv(EnvAMQPWorkers); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > maxAMQPWorkers {
			errs = append(errs, fmt.Errorf("%s=%q: want a number of messages in flight per subscription, 1 to %d", EnvAMQPWorkers, v, maxAMQPWorkers))
		}
		c.AMQP.Workers = n
	}
	if v := getenv(EnvAMQPPrefetch); v != "" {
		workers := cmp.Or(c.AMQP.Workers, defaultAMQPWorkers)
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < workers || n > maxAMQPPrefetch {
			errs = append(errs, fmt.Errorf("%s=%q: want a number of unacked messages per subscription, from %s (%d) to %d", EnvAMQPPrefetch, v, EnvAMQPWorkers, workers, maxAMQPPrefetch))
		}
		c.AMQP.Prefetch = n
	}
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
		EnvAMQPWorkers + "=" + strconv.Itoa(c.AMQP.Workers),
		EnvAMQPPrefetch + "=" + strconv.Itoa(c.AMQP.Prefetch),
	}
	if len(c.Kafka.Brokers) > 0 {
		env = append(env, EnvKafkaBrokers+"="+strings.Join(c.Kafka.Brokers, ","))
	}
	return env
}
