package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/pgtx"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestParseEnvDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := broker.ParseEnv(env(nil))
	require.NoError(t, err)
	require.Equal(t, broker.SQL, cfg.Kind, "BROKER unset means the SQL broker: only PostgreSQL needed")
	require.Equal(t, pgtx.DefaultDatabaseURL, cfg.DatabaseURL)
	require.Equal(t, "wmonce_broker", cfg.SQL.Schema)
	require.Equal(t, 4, cfg.SQL.WatermillSQL, "watermill-sql v4, as Watermill's examples")
	require.Equal(t, int32(16), cfg.Kafka.Partitions)
	require.Equal(t, int16(-1), cfg.Kafka.ReplicationFactor)
	require.Equal(t, "partition_key", cfg.Kafka.PartitionKeyField)
	require.Equal(t, broker.DefaultAMQPURL, cfg.AMQP.URL)
	require.Equal(t, "quorum", cfg.AMQP.QueueType)
}

func TestParseEnvReadsEveryVariableAndEnvironRoundTrips(t *testing.T) {
	t.Parallel()
	vars := map[string]string{
		"BROKER":                   "Kafka",
		"DATABASE_URL":             "postgres://u@db:5432/app",
		"BROKER_SQL_SCHEMA":        "topics",
		"BROKER_SQL_WATERMILL":     "v3",
		"KAFKA_BROKERS":            "k1:9092, k2:9092",
		"KAFKA_PARTITIONS":         "12",
		"KAFKA_REPLICATION_FACTOR": "3",
		"KAFKA_PARTITION_KEY":      "customer_id",
		"KAFKA_SESSION_TIMEOUT":    "7s",
		"AMQP_URL":                 "amqp://u:p@rabbit:5672/prod",
		"AMQP_PREFIX":              "shop.",
		"AMQP_QUEUE_TYPE":          "classic",
		"AMQP_WORKERS":             "1",
		"AMQP_PREFETCH":            "1",
	}
	cfg, err := broker.ParseEnv(env(vars))
	require.NoError(t, err)
	require.Equal(t, broker.Kafka, cfg.Kind)
	require.Equal(t, []string{"k1:9092", "k2:9092"}, cfg.Kafka.Brokers)
	require.Equal(t, int32(12), cfg.Kafka.Partitions)
	require.Equal(t, int16(3), cfg.Kafka.ReplicationFactor)
	require.Equal(t, "customer_id", cfg.Kafka.PartitionKeyField)
	require.Equal(t, 7*time.Second, cfg.Kafka.SessionTimeout)
	require.Equal(t, "topics", cfg.SQL.Schema)
	require.Equal(t, 3, cfg.SQL.WatermillSQL)
	require.Equal(t, "shop.", cfg.AMQP.Prefix)
	require.Equal(t, "classic", cfg.AMQP.QueueType)
	require.Equal(t, 1, cfg.AMQP.Workers, "AMQP_WORKERS=1 AMQP_PREFETCH=1: queue order without code")
	require.Equal(t, 1, cfg.AMQP.Prefetch)

	back := map[string]string{}
	for _, kv := range cfg.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		back[k] = v
	}
	again, err := broker.ParseEnv(env(back))
	require.NoError(t, err)
	require.Equal(t, cfg.Kind, again.Kind)
	require.Equal(t, cfg.Kafka, again.Kafka)
	require.Equal(t, cfg.AMQP, again.AMQP)
	require.Equal(t, cfg.SQL.Schema, again.SQL.Schema)
	require.Equal(t, cfg.SQL.WatermillSQL, again.SQL.WatermillSQL)
	require.Equal(t, cfg.DatabaseURL, again.DatabaseURL)
}

func TestBadConfigurationSaysWhatToFix(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		vars map[string]string
		want string
	}{
		"unknown broker":         {map[string]string{"BROKER": "nats"}, `use BROKER=sql, kafka or amqp`},
		"kafka without brokers":  {map[string]string{"BROKER": "kafka"}, "set KAFKA_BROKERS"},
		"kafka bad address":      {map[string]string{"BROKER": "kafka", "KAFKA_BROKERS": "localhost"}, "not host:port"},
		"partitions not numeric": {map[string]string{"KAFKA_PARTITIONS": "three"}, "KAFKA_PARTITIONS"},
		"zero replication":       {map[string]string{"BROKER": "kafka", "KAFKA_BROKERS": "k:9092", "KAFKA_REPLICATION_FACTOR": "0"}, "-1 (cluster default) or at least 1"},
		"amqp bad url":           {map[string]string{"BROKER": "amqp", "AMQP_URL": "http://rabbit"}, "amqp://user:pass@host:5672/vhost"},
		"amqp queue type":        {map[string]string{"BROKER": "amqp", "AMQP_QUEUE_TYPE": "stream"}, "quorum or classic"},
		"sql schema injection":   {map[string]string{"BROKER_SQL_SCHEMA": `x"; DROP TABLE y; --`}, "lower-case letters"},
		"watermill-sql version":  {map[string]string{"BROKER_SQL_WATERMILL": "5"}, "BROKER_SQL_WATERMILL=\"5\": want the watermill-sql major version, 3 or 4"},
		"amqp workers zero":      {map[string]string{"AMQP_WORKERS": "0"}, `AMQP_WORKERS="0": want a number of messages in flight per subscription, 1 to 1000`},
		"amqp workers text":      {map[string]string{"AMQP_WORKERS": "one"}, `AMQP_WORKERS="one"`},
		"prefetch below workers": {map[string]string{"AMQP_WORKERS": "4", "AMQP_PREFETCH": "2"}, `AMQP_PREFETCH="2": want a number of unacked messages per subscription, from AMQP_WORKERS (4) to 65535`},
		"prefetch below default": {map[string]string{"AMQP_PREFETCH": "2"}, `from AMQP_WORKERS (8)`},
		"prefetch too large":     {map[string]string{"AMQP_PREFETCH": "70000"}, `AMQP_PREFETCH="70000"`},
	} {
		_, err := broker.ParseEnv(env(tc.vars))
		require.Error(t, err, name)
		require.ErrorContains(t, err, tc.want, name)
	}
}

func TestValidateTopicPerBroker(t *testing.T) {
	t.Parallel()
	require.NoError(t, broker.TopicValidator(broker.SQL)("payments.v1:succeeded$x"))
	require.ErrorContains(t, broker.TopicValidator(broker.SQL)("payments/succeeded"), "SQL broker")
	require.ErrorContains(t, broker.TopicValidator(broker.SQL)(strings.Repeat("a", 46)), "1-45")
	require.NoError(t, broker.TopicValidator(broker.Kafka)("payments.succeeded-v1"))
	require.ErrorContains(t, broker.TopicValidator(broker.Kafka)("payments:succeeded"), "Kafka")
	require.NoError(t, broker.TopicValidator(broker.AMQP)("payments:succeeded"))
	require.ErrorContains(t, broker.TopicValidator(broker.AMQP)("amq.direct"), "amq.")
	require.ErrorContains(t, broker.ValidateGroup("a:b"), "consumer group")
	require.ErrorContains(t, broker.TopicValidator(broker.Kafka)(""), "not valid")
}

func TestNewFailsFastWhenTheBrokerIsUnreachable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := broker.New(ctx, nil, broker.Config{Kind: broker.Kafka, Kafka: broker.KafkaConfig{Brokers: []string{"127.0.0.1:1"}}}, nil)
	require.ErrorContains(t, err, "cannot reach Kafka")
	_, err = broker.New(ctx, nil, broker.Config{Kind: broker.AMQP, AMQP: broker.AMQPConfig{URL: "amqp://guest:guest@127.0.0.1:1/"}}, nil)
	require.ErrorContains(t, err, "cannot reach RabbitMQ")
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = broker.New(ctx, nil, broker.Config{Kind: broker.SQL, DatabaseURL: "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"}, nil)
	require.ErrorContains(t, err, "cannot reach PostgreSQL")
}

// TestNewDefaultsAndLimits: the RabbitMQ and SQL wake-up defaults, and the settings New
// refuses before connecting to anything.
func TestNewDefaultsAndLimits(t *testing.T) {
	t.Parallel()
	cfg, err := broker.ParseEnv(env(nil))
	require.NoError(t, err)
	require.Equal(t, 8, cfg.AMQP.Workers)
	require.Equal(t, 32, cfg.AMQP.Prefetch)
	require.Equal(t, 100*time.Millisecond, cfg.SQL.PollInterval)
	require.Equal(t, 3*time.Second, cfg.SQL.IdlePollInterval)
	require.False(t, cfg.SQL.DisableListen)
	require.LessOrEqual(t, len(cfg.SQL.NotifyChannel()), 63, "PostgreSQL channel names are identifiers")
	require.NotEqual(t, cfg.SQL.NotifyChannel(), broker.SQLConfig{Schema: "other"}.NotifyChannel())

	ctx := context.Background()
	_, err = broker.New(ctx, nil, broker.Config{Kind: broker.AMQP, AMQP: broker.AMQPConfig{Workers: 8, Prefetch: 4}}, nil)
	require.ErrorContains(t, err, "AMQP.Prefetch must be between Workers (8)")
	_, err = broker.New(ctx, nil, broker.Config{Kind: broker.AMQP, AMQP: broker.AMQPConfig{Workers: -1}}, nil)
	require.ErrorContains(t, err, "AMQP.Workers must be between 1 and 1000")
	_, err = broker.New(ctx, nil, broker.Config{Kind: broker.SQL, SQL: broker.SQLConfig{WatermillSQL: 2}}, nil)
	require.ErrorContains(t, err, "SQL.WatermillSQL (BROKER_SQL_WATERMILL) is the watermill-sql major version and must be 3 or 4, got 2")
	_, err = broker.New(ctx, nil, broker.Config{Kind: broker.SQL, SQL: broker.SQLConfig{IdlePollInterval: -time.Second}}, nil)
	require.ErrorContains(t, err, "IdlePollInterval")
}
