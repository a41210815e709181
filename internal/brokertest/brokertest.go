// Package brokertest gives tests a real broker of each kind, isolated per test: the SQL broker
// in the test's own PostgreSQL schema, RabbitMQ in a virtual host of its own (created and
// deleted with rabbitmqctl), and Kafka on KAFKA_BROKERS or, when that is unset and the test's
// module sets StartEmbeddedKafka (e2e, examples), on one embedded kfake broker shared by the
// test binary, with unique topic names.
package brokertest

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// Config returns a broker configuration for kind, isolated for this test. schema is the test's
// PostgreSQL schema (pgtest.Schema); the SQL broker keeps its topic tables there. The SQL
// broker runs on the watermill-sql version BROKER_SQL_WATERMILL names (3 or 4), else on the
// default.
func Config(t testing.TB, kind broker.Kind, schema string) broker.Config {
	t.Helper()
	cfg := broker.Config{Kind: kind, DatabaseURL: pgtest.URL()}
	switch kind {
	case broker.SQL:
		cfg.SQL.Schema = schema
		if v := os.Getenv(broker.EnvSQLWatermill); v != "" {
			n, err := strconv.Atoi(strings.TrimPrefix(v, "v"))
			if err != nil {
				t.Fatalf("%s=%q: want the watermill-sql major version, 3 or 4", broker.EnvSQLWatermill, v)
			}
			cfg.SQL.WatermillSQL = n
		}
		cfg.SQL.PollInterval = 20 * time.Millisecond
		// A delivery that nobody acks (a suite function that gave up on a stalled read, a
		// subscriber left open) keeps its transaction for AckDeadline, and that transaction
		// holds back every SQL subscription on the server, in every test binary: with the
		// default 30 s the universal suites' 15 s reads beside it failed in CI. 10 s bounds the
		// stall; tests that need a longer deadline set their own.
		cfg.SQL.AckDeadline = 10 * time.Second
	case broker.Kafka:
		cfg.Kafka.Brokers = KafkaBrokers(t)
		cfg.Kafka.SessionTimeout = 6 * time.Second
	case broker.AMQP:
		cfg.AMQP.URL = AMQPVhost(t)
	}
	return cfg
}

// SkipShort skips t under -short, naming the service it needs: `go test -short` runs with no
// service at all. Without -short a missing service fails the test, saying what to start.
func SkipShort(t testing.TB, service string) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs " + service + ": skipped under -short")
	}
}

var (
	kafkaOnce  sync.Once
	kafkaAddrs []string
	kafkaErr   error
)

// StartEmbeddedKafka, when set, starts the in-process kfake broker KafkaBrokers uses when
// KAFKA_BROKERS is unset. The e2e and examples modules set it (internal/embeddedkafka); the
// library's own tests leave it nil, so that the library's go.mod does not require kfake, and
// need a real Kafka.
var StartEmbeddedKafka func() ([]string, error)

// KafkaBrokers returns KAFKA_BROKERS when set, else the address of the embedded kfake broker
// (StartEmbeddedKafka) started once for the test binary, else fails t saying what to start. On
// KAFKA_BROKERS it holds a shared lock on the cluster until t ends (see LockKafkaExclusive), so
// a test that kills the broker waits for this one.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	if addrs := RealKafka(); addrs != nil {
		SkipShort(t, "Kafka (KAFKA_BROKERS="+strings.Join(addrs, ",")+")")
		lockKafka(t, addrs, false)
		return addrs
	}
	if addrs := kafkaBrokersEnv(); addrs != nil { // KAFKA_EMBEDDED=1: kfake served by another process
		SkipShort(t, "the kfake broker at KAFKA_BROKERS="+strings.Join(addrs, ","))
		return addrs
	}
	if StartEmbeddedKafka == nil {
		SkipShort(t, "Kafka (KAFKA_BROKERS)")
		t.Fatalf("%s is not set: start Kafka (make services starts Kafka 3.9 at 127.0.0.1:9092) and set %s=127.0.0.1:9092; the embedded kfake broker serves the e2e and examples modules only", broker.EnvKafkaBrokers, broker.EnvKafkaBrokers)
	}
	kafkaOnce.Do(func() { kafkaAddrs, kafkaErr = StartEmbeddedKafka() })
	if kafkaErr != nil {
		t.Fatalf("cannot start the embedded Kafka broker: %v (or set KAFKA_BROKERS to a running cluster)", kafkaErr)
	}
	return kafkaAddrs
}

// AMQPBaseURL is AMQP_URL or the local default.
func AMQPBaseURL() string {
	if v := os.Getenv(broker.EnvAMQPURL); v != "" {
		return v
	}
	return broker.DefaultAMQPURL
}

// AMQPVhost creates a RabbitMQ virtual host for this test, grants the URL's user every
// permission on it, deletes it (with every queue and exchange in it) when the test ends, and
// returns the URL pointing at it.
func AMQPVhost(t testing.TB) string {
	t.Helper()
	SkipShort(t, "RabbitMQ (AMQP_URL, default "+broker.DefaultAMQPURL+")")
	u, err := url.Parse(AMQPBaseURL())
	if err != nil {
		t.Fatalf("AMQP_URL: %v", err)
	}
	vhost := pgtest.NewName("wmonce_test")
	user := u.User.Username()
	if user == "" {
		user = "guest"
	}
	Rabbitmqctl(t, "add_vhost", vhost)
	t.Cleanup(func() {
		if os.Getenv("PGTEST_KEEP") != "" {
			return
		}
		if out, err := rabbitmqctl("delete_vhost", vhost); err != nil {
			t.Logf("delete vhost %s: %v\n%s", vhost, err, out)
		}
	})
	Rabbitmqctl(t, "set_permissions", "-p", vhost, user, ".*", ".*", ".*")
	u.Path = "/" + vhost
	u.RawPath = ""
	return u.String()
}

// AMQPQueueDepth is the number of ready messages in a queue (declared as this module declares
// its queues: durable, quorum unless AMQP_QUEUE_TYPE says otherwise).
func AMQPQueueDepth(t testing.TB, amqpURL, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatalf("connect to RabbitMQ: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open RabbitMQ channel: %v", err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect queue %q: %v", queue, err)
	}
	return q.Messages
}

// Vhost returns the virtual host of an AMQP URL.
func Vhost(amqpURL string) string {
	u, err := url.Parse(amqpURL)
	if err != nil || u.Path == "" || u.Path == "/" {
		return "/"
	}
	return strings.TrimPrefix(u.Path, "/")
}

// Rabbitmqctl runs rabbitmqctl and fails the test, saying what is missing, if it does not work.
func Rabbitmqctl(t testing.TB, args ...string) string {
	t.Helper()
	SkipShort(t, "RabbitMQ and rabbitmqctl")
	out, err := rabbitmqctl(args...)
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s\nThese tests need RabbitMQ and its CLI: a local rabbitmq-server with rabbitmqctl on PATH (start it with `rabbitmq-server -detached`), or `docker compose up -d rabbitmq` (the CLI is then run inside the container), or RABBITMQCTL set to a command that runs rabbitmqctl.", strings.Join(args, " "), err, out)
	}
	return out
}

// RabbitmqctlErr runs the RabbitMQ CLI like Rabbitmqctl, returning its error instead of failing
// a test: for callers outside a test's goroutine, such as a fault injector.
func RabbitmqctlErr(args ...string) (string, error) { return rabbitmqctl(args...) }

func rabbitmqctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := rabbitmqctlCommand()
	out, err := exec.CommandContext(ctx, cmd[0], append(append(cmd[1:], "-q"), args...)...).CombinedOutput()
	return string(out), err
}

// rabbitmqctlCommand finds the RabbitMQ CLI: $RABBITMQCTL (a command line) if set, else
// rabbitmqctl on PATH, else the one inside this repository's docker compose service, so that
// `docker compose up -d rabbitmq` is all a machine without a local RabbitMQ needs.
func rabbitmqctlCommand() []string {
	if v := strings.Fields(os.Getenv("RABBITMQCTL")); len(v) > 0 {
		return v
	}
	if _, err := exec.LookPath("rabbitmqctl"); err == nil {
		return []string{"rabbitmqctl"}
	}
	if _, err := exec.LookPath("docker"); err == nil {
		if _, file, _, ok := runtime.Caller(0); ok {
			compose := filepath.Join(filepath.Dir(file), "..", "..", "docker-compose.yml")
			return []string{"docker", "compose", "-f", compose, "exec", "-T", "rabbitmq", "rabbitmqctl"}
		}
	}
	return []string{"rabbitmqctl"}
}
