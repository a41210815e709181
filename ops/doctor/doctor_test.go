package doctor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/doctor"
	"github.com/wmonce/watermill-once/ops/retention"
)

const day = 24 * time.Hour

// kafkaTopics creates a topic per entry of configs (topic -> config entries) and deletes them
// when t ends.
func kafkaTopics(t *testing.T, addrs []string, configs map[string]map[string]string) {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_1_0_0
	admin, err := sarama.NewClusterAdmin(addrs, sc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	for topic, entries := range configs {
		ce := map[string]*string{}
		for k, v := range entries {
			ce[k] = &v
		}
		require.NoError(t, admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1, ConfigEntries: ce}, false))
		t.Cleanup(func() { _ = admin.DeleteTopic(topic) })
		// CreateTopics answers before every broker serves the new topic's configuration.
		testwait.Until(t, "topic "+topic+" configured as created", func() bool {
			res, err := admin.DescribeConfigs([]*sarama.ConfigResource{{Type: sarama.TopicResource, Name: topic}}, sarama.DescribeConfigsOptions{})
			if err != nil || len(res) != 1 || res[0].ErrorCode != sarama.ErrNoError {
				return false
			}
			seen := map[string]string{}
			for _, e := range res[0].Configs {
				seen[e.Name] = e.Value
			}
			for k, v := range entries {
				if seen[k] != v {
					return false
				}
			}
			return true
		})
	}
}

func finding(t *testing.T, rep doctor.Report, consumer, sourcePrefix string) doctor.Finding {
	t.Helper()
	for _, f := range rep.Findings {
		if f.Consumer == consumer && strings.HasPrefix(f.Source, sourcePrefix) {
			t.Logf("%s", f)
			return f
		}
	}
	t.Fatalf("no finding for consumer %s, source %s in %v", consumer, sourcePrefix, rep.Findings)
	return doctor.Finding{}
}

func TestKafkaTopicRetentionAgainstClaimRetention(t *testing.T) {
	addrs := brokertest.KafkaBrokers(t)
	safe, forever, compacted := pgtest.NewName("doctor_safe"), pgtest.NewName("doctor_forever"), pgtest.NewName("doctor_compact")
	kafkaTopics(t, addrs, map[string]map[string]string{
		safe:      {"retention.ms": "86400000"}, // 1 day, within the 7 days keys are kept
		forever:   {"retention.ms": "-1"},
		compacted: {"cleanup.policy": "compact"},
	})
	rep, err := doctor.Check(context.Background(), doctor.Config{
		Kafka: doctor.KafkaConfig{Brokers: addrs},
		Consumers: []doctor.Consumer{
			{Name: "payments", KafkaTopics: []string{safe, forever, compacted}},
			{Name: "guarded", KafkaTopics: []string{forever}, MaxMessageAge: 6 * day},
			{Name: "loose-guard", KafkaTopics: []string{safe}, MaxMessageAge: 10 * day},
		},
	})
	require.NoError(t, err)

	f := finding(t, rep, "payments", "kafka topic "+safe)
	require.True(t, f.Known)
	require.False(t, f.Hazard)
	require.Equal(t, day, f.Horizon)
	require.Equal(t, retention.DefaultKeep, f.KeyKept)
	require.Contains(t, strings.Join(f.Details, "\n"), "offsets.retention.minutes=")

	f = finding(t, rep, "payments", "kafka topic "+forever)
	require.True(t, f.Hazard, "a topic that keeps messages forever, keys kept 7 days, no guard")
	require.Equal(t, doctor.Unbounded, f.Horizon)
	require.Contains(t, f.Fix, "retention.ms of topic "+forever)
	require.Contains(t, f.Fix, "MaxMessageAge a little below 168h0m0s")

	f = finding(t, rep, "payments", "kafka topic "+compacted)
	require.True(t, f.Hazard, "a compacted topic keeps the last message of each key forever")

	f = finding(t, rep, "guarded", "kafka topic "+forever)
	require.False(t, f.Hazard, "the age guard refuses copies older than the keys")
	require.Contains(t, f.Verdict, "refuses and parks")

	f = finding(t, rep, "loose-guard", "kafka topic "+safe)
	require.True(t, f.Hazard, "an age guard longer than the key retention lets copies through")

	require.Len(t, rep.Hazards(), 3)
	require.Contains(t, rep.Summary(), "REDELIVERY HAZARD on 3 of 5")
}

func TestKafkaTopicUnreachableIsUnknown(t *testing.T) {
	rep, err := doctor.Check(context.Background(), doctor.Config{
		Kafka:     doctor.KafkaConfig{Brokers: []string{"127.0.0.1:1"}},
		Consumers: []doctor.Consumer{{Name: "c", KafkaTopics: []string{"t"}}},
		Timeout:   10 * time.Second,
	})
	require.NoError(t, err)
	f := finding(t, rep, "c", "kafka topic t")
	require.False(t, f.Known)
	require.False(t, f.Hazard)
	require.Contains(t, f.Fix, "MaxMessageAge")
}

// amqpQueues declares a queue with a one-hour TTL, one without and one whose dead letters go
// to a queue without TTL, on a vhost of the test's own.
func amqpQueues(t *testing.T) (amqpURL string) {
	t.Helper()
	amqpURL = brokertest.AMQPVhost(t)
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare("ttl-1h", true, false, false, false, amqp.Table{"x-message-ttl": int32(3600_000)})
	require.NoError(t, err)
	_, err = ch.QueueDeclare("no-ttl", true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclare("dlx", "fanout", true, false, false, false, nil))
	_, err = ch.QueueDeclare("dead-letters", true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind("dead-letters", "", "dlx", false, nil))
	_, err = ch.QueueDeclare("with-dlq", true, false, false, false, amqp.Table{"x-message-ttl": int32(60_000), "x-dead-letter-exchange": "dlx"})
	require.NoError(t, err)
	return amqpURL
}

// Both ways of reading a queue: through the management API (e2e/services enables it),
// which follows dead-letter queues, and over AMQP alone (a management URL that answers nothing),
// which names the dead-letter exchange.
func TestRabbitMQQueueTTLsAgainstClaimRetention(t *testing.T) {
	t.Run("management API", func(t *testing.T) { checkRabbitMQQueueTTLs(t, "") })
	t.Run("AMQP only", func(t *testing.T) { checkRabbitMQQueueTTLs(t, "http://127.0.0.1:1") })
}

func checkRabbitMQQueueTTLs(t *testing.T, managementURL string) {
	amqpURL := amqpQueues(t)
	rep, err := doctor.Check(context.Background(), doctor.Config{
		AMQP:      doctor.AMQPConfig{URL: amqpURL, ManagementURL: managementURL},
		Retention: retention.Config{Consumers: map[string]retention.Policy{"short": {Keep: 30 * time.Minute}}},
		Consumers: []doctor.Consumer{
			{Name: "sms", AMQPQueues: []string{"ttl-1h", "no-ttl", "with-dlq"}},
			{Name: "short", AMQPQueues: []string{"ttl-1h"}},
			{Name: "redrive", AMQPQueues: []string{"dead-letters"}},
		},
	})
	require.NoError(t, err)

	f := finding(t, rep, "sms", "rabbitmq queue ttl-1h")
	require.True(t, f.Known)
	require.False(t, f.Hazard)
	require.Equal(t, time.Hour, f.Horizon)

	f = finding(t, rep, "sms", "rabbitmq queue no-ttl")
	require.True(t, f.Hazard, "a queue without TTL keeps a duplicate for ever")
	require.Equal(t, doctor.Unbounded, f.Horizon)

	f = finding(t, rep, "sms", "rabbitmq queue with-dlq")
	require.False(t, f.Hazard)
	require.Equal(t, time.Minute, f.Horizon)
	details := strings.Join(f.Details, "\n")
	if managementURL != "" {
		// No management API: the dead-letter exchange is named, its queues not followed.
		require.Contains(t, details, "not reachable")
		require.Contains(t, details, "dead-letter exchange is dlx")
	} else {
		require.NotContains(t, details, "not reachable",
			"the management API on 127.0.0.1:15672 does not answer: `bash e2e/services up` enables rabbitmq_management")
		dlq := finding(t, rep, "sms", "rabbitmq dead-letter queue dead-letters")
		require.True(t, dlq.Hazard, "a dead-letter queue without TTL can be redriven any time")
	}

	f = finding(t, rep, "redrive", "rabbitmq queue dead-letters")
	require.True(t, f.Hazard, "a dead-letter queue without TTL can be redriven any time")

	f = finding(t, rep, "short", "rabbitmq queue ttl-1h")
	require.True(t, f.Hazard, "keys kept 30 minutes, copies up to an hour old")
	require.Contains(t, f.Fix, "of at least 1h0m0s")
}

func TestStartCheckLogsOneLineAndExportsTheHazard(t *testing.T) {
	amqpURL := amqpQueues(t)
	reg := prometheus.NewRegistry()
	logs := &captureLogger{}
	cfg := doctor.StartConfig{
		Config: doctor.Config{
			AMQP:      doctor.AMQPConfig{URL: amqpURL},
			Consumers: []doctor.Consumer{{Name: "sms", AMQPQueues: []string{"no-ttl"}}},
		},
		Registerer:   reg,
		FailOnHazard: true,
	}
	_, err := doctor.StartCheck(context.Background(), cfg, 0, logs)
	require.ErrorIs(t, err, doctor.ErrHazard)
	require.Len(t, logs.lines, 1)
	require.Contains(t, logs.lines[0], "REDELIVERY HAZARD")
	n, err := testutil.GatherAndCount(reg, "wmonce_redelivery_hazard")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP wmonce_redelivery_hazard 1 when a copy from this source can arrive after its key was pruned (applied again), else 0.
# TYPE wmonce_redelivery_hazard gauge
wmonce_redelivery_hazard{consumer="sms",source="rabbitmq queue no-ttl"} 1
`), "wmonce_redelivery_hazard"))

	// The middleware's age guard, passed in, makes the same setup safe.
	logs = &captureLogger{}
	cfg.Registerer = nil
	_, err = doctor.StartCheck(context.Background(), cfg, 6*day, logs)
	require.NoError(t, err)
	require.Len(t, logs.lines, 1)
	require.Contains(t, logs.lines[0], "no redelivery hazard")
}

type captureLogger struct {
	watermill.NopLogger
	lines []string
}

func (l *captureLogger) Error(msg string, err error, _ watermill.LogFields) {
	l.lines = append(l.lines, msg+": "+err.Error())
}
func (l *captureLogger) Info(msg string, _ watermill.LogFields) { l.lines = append(l.lines, msg) }

func TestOnceMiddlewareRunsTheCheckAtStart(t *testing.T) {
	amqpURL := amqpQueues(t)
	cfg := doctor.StartConfig{
		Config:       doctor.Config{AMQP: doctor.AMQPConfig{URL: amqpURL}, Consumers: []doctor.Consumer{{Name: "sms", AMQPQueues: []string{"no-ttl"}}}},
		FailOnHazard: true,
	}
	db := pgtest.DB(t)
	logs := &captureLogger{}
	_, err := once.New(db, once.Config{Consumer: "sms", StartCheck: doctor.OnceStartCheck(cfg, logs)}, nil)
	require.ErrorIs(t, err, doctor.ErrHazard)
	require.Len(t, logs.lines, 1)

	// The middleware's age guard is the consumer's: the same queue is then safe.
	logs = &captureLogger{}
	mw, err := once.New(db, once.Config{Consumer: "sms", MaxMessageAge: 6 * day, StartCheck: doctor.OnceStartCheck(cfg, logs)}, nil)
	require.NoError(t, err)
	require.NoError(t, mw.Close())
	require.Equal(t, []string{"doctor: 1 consumer source(s) checked, no redelivery hazard (0 unknown)"}, logs.lines)

	_, err = once.New(db, once.Config{Consumer: "other", StartCheck: doctor.OnceStartCheck(cfg, logs)}, nil)
	require.ErrorContains(t, err, `consumer "other" is not in the doctor's Consumers`)
}
