package e2e_test

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/e2e"
	"github.com/wmonce/watermill-once/internal/brokertest"
)

// The commands the suite runs as separate processes, built once by TestMain.
var consumerBinary, relayBinary, producerBinary string

// TestMain builds the consumer, relay and producer commands once (with the race detector when
// the tests have it), so the suite can run them as separate processes and kill them. Under
// -short it builds nothing: every test here needs PostgreSQL, so each one skips.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "wmonce-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, b := range []struct {
		path *string
		pkg  string
	}{{&consumerBinary, "consumer"}, {&relayBinary, "relay"}, {&producerBinary, "producer"}} {
		*b.path = filepath.Join(dir, b.pkg)
		args := []string{"build", "-o", *b.path}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./internal/"+b.pkg)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: cannot build the %s command (is the go tool on PATH?): %v\n", b.pkg, err)
			os.Exit(1)
		}
	}
	if d := os.Getenv("E2E_LOG_DIR"); d != "" {
		// Sarama's log of this process (the Kafka relay's publisher), for post-mortems next to
		// the consumer logs.
		if err := os.MkdirAll(d, 0o755); err == nil {
			if f, err := os.Create(filepath.Join(d, "test-process-sarama.log")); err == nil {
				sarama.Logger = log.New(f, "[sarama] ", log.LstdFlags|log.Lmicroseconds)
			}
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func options(t *testing.T) e2e.Options {
	opts := e2e.Options{ConsumerBinary: consumerBinary}
	if os.Getenv("E2E_SOAK") != "" {
		opts.Events, opts.Producers, opts.Timeout = 5000, 8, 20*time.Minute
	}
	if v := os.Getenv("E2E_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 8 {
			t.Fatalf("E2E_EVENTS=%q: want a number of events, at least 8", v)
		}
		opts.Events = n
	}
	return opts
}

func TestEffectivelyOnceOverSQL(t *testing.T) {
	t.Parallel()
	e2e.Run(t, e2e.Target{
		Name:   "sql",
		Config: func(t *testing.T, schema string) broker.Config { return brokertest.Config(t, broker.SQL, schema) },
	}, options(t))
}

// TestEffectivelyOnceOverKafka runs the fault suite on the embedded kfake broker, or on
// KAFKA_BROKERS. On KAFKA_BROKERS the broker process is also killed with SIGKILL mid-stream and
// started again, through e2e/services: KAFKA_SERVICE (3.9 or 4) names its line there, and
// the test fails without it. The test holds the cluster exclusively while it runs
// (brokertest.LockKafkaExclusive): other Kafka tests, here or in other packages running at the
// same time, wait instead of losing their broker.
func TestEffectivelyOnceOverKafka(t *testing.T) {
	t.Parallel()
	target := e2e.Target{
		Name:   "kafka",
		Config: func(t *testing.T, schema string) broker.Config { return brokertest.Config(t, broker.Kafka, schema) },
		Describe: func(t *testing.T, cfg broker.Config) string {
			if brokertest.RealKafka() == nil {
				return "embedded kfake at " + strings.Join(cfg.Kafka.Brokers, ",") + "; Sarama protocol " + broker.KafkaProtocolVersion
			}
			v, err := brokertest.KafkaVersion(context.Background(), cfg.Kafka.Brokers)
			if err != nil {
				v = "release unknown: " + err.Error()
			}
			return broker.EnvKafkaBrokers + "=" + strings.Join(cfg.Kafka.Brokers, ",") + "; " + v + "; Sarama protocol " + broker.KafkaProtocolVersion
		},
	}
	if brokertest.RealKafka() == nil {
		t.Run("BrokerSIGKILL", func(t *testing.T) {
			t.Skipf("the broker-kill fault needs a real Kafka broker process: run with %s=127.0.0.1:9092 %s=3.9 (or %s=127.0.0.1:9094 %s=4), brokers started by e2e/services",
				broker.EnvKafkaBrokers, brokertest.EnvKafkaService, broker.EnvKafkaBrokers, brokertest.EnvKafkaService)
		})
	} else {
		line := brokertest.KafkaService(t)
		brokertest.LockKafkaExclusive(t)
		target.KillBroker = func(t *testing.T) func(t *testing.T) {
			t.Logf("e2e[kafka] %s", brokertest.KillKafka(t, line))
			return func(t *testing.T) { t.Logf("e2e[kafka] %s", brokertest.StartKafka(t, line)) }
		}
	}
	opts := options(t)
	e2e.Run(t, target, opts)
}

var closedConnections = regexp.MustCompile(`Closed (\d+) connections`)

func TestEffectivelyOnceOverRabbitMQ(t *testing.T) {
	t.Parallel()
	e2e.Run(t, e2e.Target{
		Name:             "amqp",
		Config:           func(t *testing.T, schema string) broker.Config { return brokertest.Config(t, broker.AMQP, schema) },
		BreakConnections: breakAMQPConnections,
	}, options(t))
}

// breakAMQPConnections closes every client connection of cfg's vhost.
func breakAMQPConnections(t *testing.T, cfg broker.Config) (int, error) {
	out := brokertest.Rabbitmqctl(t, "close_all_connections", "-p", brokertest.Vhost(cfg.AMQP.URL), "watermill-once e2e fault injection")
	m := closedConnections.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("unexpected rabbitmqctl output %q", out)
	}
	return strconv.Atoi(m[1])
}
