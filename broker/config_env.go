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

// ParseEnv reads the Env... variables through getenv, applies the defaults and validates the
// result. Unset variables keep their defaults; a malformed one is an error naming it.
func ParseEnv(getenv func(string) string) (Config, error) {
	var c Config
	var errs []error
	for _, e := range envVars {
		// An unset (empty) variable keeps the zero value, which setDefaults fills in.
		if v := getenv(e.name); v != "" {
			if err := e.parse(&c, v); err != nil {
				errs = append(errs, err)
			}
		}
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

// envVar is one variable ParseEnv reads: parse stores a set value in the Config and returns
// an error naming the variable when the value is malformed.
type envVar struct {
	name  string
	parse func(c *Config, v string) error
}

// envVars in the order ParseEnv reads them: AMQP_PREFETCH's range depends on AMQP_WORKERS, so
// workers come first.
var envVars = []envVar{
	{EnvBroker, func(c *Config, v string) error { c.Kind = Kind(strings.ToLower(strings.TrimSpace(v))); return nil }},
	{EnvDatabaseURL, func(c *Config, v string) error { c.DatabaseURL = v; return nil }},
	{EnvSQLSchema, func(c *Config, v string) error { c.SQL.Schema = v; return nil }},
	{EnvSQLWatermill, parseEnvSQLWatermill},
	{EnvKafkaBrokers, parseEnvKafkaBrokers},
	{EnvKafkaPartitions, parseEnvKafkaPartitions},
	{EnvKafkaReplication, parseEnvKafkaReplication},
	{EnvKafkaPartitionKey, func(c *Config, v string) error { c.Kafka.PartitionKeyField = v; return nil }},
	{EnvKafkaSession, parseEnvKafkaSession},
	{EnvAMQPURL, func(c *Config, v string) error { c.AMQP.URL = v; return nil }},
	{EnvAMQPPrefix, func(c *Config, v string) error { c.AMQP.Prefix = v; return nil }},
	{EnvAMQPQueueType, func(c *Config, v string) error { c.AMQP.QueueType = strings.ToLower(v); return nil }},
	// Workers and Prefetch: ordered consumption (1 and 1) without code, and a variable named in
	// the error when a value is out of AMQPConfig's range.
	{EnvAMQPWorkers, parseEnvAMQPWorkers},
	{EnvAMQPPrefetch, parseEnvAMQPPrefetch},
}

func parseEnvSQLWatermill(c *Config, v string) error {
	n, err := strconv.Atoi(strings.TrimPrefix(strings.ToLower(strings.TrimSpace(v)), "v"))
	c.SQL.WatermillSQL = n
	if err != nil || (n != 3 && n != 4) {
		return fmt.Errorf("%s=%q: want the watermill-sql major version, 3 or 4", EnvSQLWatermill, v)
	}
	return nil
}

func parseEnvKafkaBrokers(c *Config, v string) error {
	if strings.TrimSpace(v) == "" {
		return nil
	}
	for _, b := range strings.Split(v, ",") {
		c.Kafka.Brokers = append(c.Kafka.Brokers, strings.TrimSpace(b))
	}
	return nil
}

func parseEnvKafkaPartitions(c *Config, v string) error {
	n, err := strconv.ParseInt(v, 10, 32)
	c.Kafka.Partitions = int32(n)
	if err != nil || n < 1 {
		return fmt.Errorf("%s=%q: want a number of partitions, at least 1", EnvKafkaPartitions, v)
	}
	return nil
}

func parseEnvKafkaReplication(c *Config, v string) error {
	n, err := strconv.ParseInt(v, 10, 16)
	c.Kafka.ReplicationFactor = int16(n)
	if err != nil || n == 0 || n < -1 {
		return fmt.Errorf("%s=%q: want -1 (cluster default) or at least 1", EnvKafkaReplication, v)
	}
	return nil
}

func parseEnvKafkaSession(c *Config, v string) error {
	d, err := time.ParseDuration(v)
	c.Kafka.SessionTimeout = d
	if err != nil || d < time.Second {
		return fmt.Errorf("%s=%q: want a duration of at least 1s, e.g. 10s", EnvKafkaSession, v)
	}
	return nil
}

func parseEnvAMQPWorkers(c *Config, v string) error {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	c.AMQP.Workers = n
	if err != nil || n < 1 || n > maxAMQPWorkers {
		return fmt.Errorf("%s=%q: want a number of messages in flight per subscription, 1 to %d", EnvAMQPWorkers, v, maxAMQPWorkers)
	}
	return nil
}

// parseEnvAMQPPrefetch runs after parseEnvAMQPWorkers: the lower bound is the workers set.
func parseEnvAMQPPrefetch(c *Config, v string) error {
	workers := cmp.Or(c.AMQP.Workers, defaultAMQPWorkers)
	n, err := strconv.Atoi(strings.TrimSpace(v))
	c.AMQP.Prefetch = n
	if err != nil || n < workers || n > maxAMQPPrefetch {
		return fmt.Errorf("%s=%q: want a number of unacked messages per subscription, from %s (%d) to %d", EnvAMQPPrefetch, v, EnvAMQPWorkers, workers, maxAMQPPrefetch)
	}
	return nil
}

// Environ returns the configuration as the variables ParseEnv reads ("KEY=value"), for a child
// process; settings without a variable are left out.
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
