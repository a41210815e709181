package e2e_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/e2e"
	"github.com/wmonce/watermill-once/internal/brokertest"
)

// TestChaos is the chaos mode (see e2e.RunChaos) on each broker in turn. It restarts
// PostgreSQL, RabbitMQ and the Kafka broker, so it runs only when asked, alone:
//
//	E2E_CHAOS=ci    about 3,000 events per broker (CI runs it after the other tests)
//	E2E_CHAOS=long  20,000 events per broker; the reports go to e2e/results/
//
// E2E_CHAOS_SEED reproduces a run's nemesis. Kafka runs on the real broker: KAFKA_BROKERS and
// KAFKA_SERVICE (3.9 or 4, the line e2e/services kills and restarts) must be set.
func TestChaos(t *testing.T) {
	mode := os.Getenv("E2E_CHAOS")
	if mode == "" {
		t.Skip("the chaos mode restarts PostgreSQL and the brokers: run it alone with E2E_CHAOS=ci or E2E_CHAOS=long")
	}
	opts := e2e.ChaosOptions{ConsumerBinary: consumerBinary, RelayBinary: relayBinary, ProducerBinary: producerBinary}
	switch mode {
	case "ci":
	case "long":
		opts.Events, opts.Producers, opts.Pace, opts.Timeout = 20000, 4, 15*time.Millisecond, 40*time.Minute
	default:
		t.Fatalf("E2E_CHAOS=%q: want ci or long", mode)
	}
	if v := os.Getenv("E2E_CHAOS_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "E2E_CHAOS_SEED")
		opts.Seed = seed
	}
	if v := os.Getenv("E2E_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "E2E_EVENTS")
		opts.Events = n
	}
	crashPG := func(ctx context.Context) error { return e2e.ServicesScript(ctx, "pg-crash") }
	targets := []e2e.ChaosTarget{
		{
			Name:          "sql",
			Config:        func(t *testing.T, schema string) broker.Config { return brokertest.Config(t, broker.SQL, schema) },
			CrashPostgres: crashPG,
		},
		{
			Name:          "kafka",
			Config:        func(t *testing.T, schema string) broker.Config { return brokertest.Config(t, broker.Kafka, schema) },
			CrashPostgres: crashPG,
			RestartBroker: func(ctx context.Context) error {
				line := os.Getenv(brokertest.EnvKafkaService)
				if err := e2e.ServicesScript(ctx, "kafka-kill", line); err != nil {
					return err
				}
				return e2e.ServicesScript(ctx, "kafka-start", line)
			},
		},
		{
			Name:          "amqp",
			Config:        func(t *testing.T, schema string) broker.Config { return brokertest.Config(t, broker.AMQP, schema) },
			CrashPostgres: crashPG,
			RestartBroker: func(ctx context.Context) error {
				for _, args := range [][]string{{"stop_app"}, {"start_app"}, {"await_startup"}} {
					if _, err := brokertest.RabbitmqctlErr(args...); err != nil {
						return err
					}
				}
				return nil
			},
			BreakConnections: breakAMQPConnections,
		},
	}
	for _, target := range targets {
		t.Run(target.Name, func(t *testing.T) {
			if target.Name == "kafka" {
				if brokertest.RealKafka() == nil {
					t.Fatal("chaos on Kafka runs on the real broker: start it (make services) and set KAFKA_BROKERS=127.0.0.1:9092 KAFKA_SERVICE=3.9")
				}
				brokertest.KafkaService(t) // fails saying what to set when KAFKA_SERVICE is missing
				// It kills the broker: other Kafka tests on this machine wait until it is done.
				brokertest.LockKafkaExclusive(t)
			}
			report := e2e.RunChaos(t, target, opts)
			if mode == "long" {
				b, err := json.MarshalIndent(report, "", "  ")
				require.NoError(t, err)
				require.NoError(t, os.MkdirAll("results", 0o755))
				require.NoError(t, os.WriteFile(filepath.Join("results", "chaos-long-"+target.Name+".json"), append(b, '\n'), 0o644))
			}
		})
	}
}
