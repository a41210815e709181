package e2e_test

import (
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

// TestCDC is the CDC fault pass (see e2e.RunCDC): the outbox read by Debezium in a Kafka
// Connect cluster of two workers. It kills a Connect worker and restarts PostgreSQL and the
// Kafka broker, so it runs only when asked, alone:
//
//	E2E_CDC=ci    2,000 events (CI runs it after the chaos mode)
//	E2E_CDC=long  20,000 events; the report goes to e2e/results/cdc-long.json
//
// It needs e2e/services up (PostgreSQL with wal_level=logical, Kafka 4 on 127.0.0.1:9094,
// the Connect workers): KAFKA_BROKERS=127.0.0.1:9094 KAFKA_SERVICE=4. E2E_CHAOS_SEED
// reproduces a run's nemesis, E2E_EVENTS overrides the size.
func TestCDC(t *testing.T) {
	mode := os.Getenv("E2E_CDC")
	if mode == "" {
		t.Skip("the CDC fault pass restarts PostgreSQL, Kafka and a Connect worker: run it alone with E2E_CDC=ci or E2E_CDC=long")
	}
	opts := e2e.CDCOptions{ConsumerBinary: consumerBinary, ProducerBinary: producerBinary,
		Config: func(t *testing.T, schema string) broker.Config { return brokertest.Config(t, broker.Kafka, schema) }}
	switch mode {
	case "ci":
	case "long":
		// About 5 minutes of producing, so that the faults hit while events flow.
		opts.Events, opts.Producers, opts.Pace, opts.Timeout = 20000, 4, 50*time.Millisecond, 40*time.Minute
	default:
		t.Fatalf("E2E_CDC=%q: want ci or long", mode)
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
	if brokertest.RealKafka() == nil {
		t.Fatal("the CDC pass runs on the real broker the Connect workers write to: e2e/services up, KAFKA_BROKERS=127.0.0.1:9094 KAFKA_SERVICE=4")
	}
	opts.KafkaLine = brokertest.KafkaService(t)
	brokertest.LockKafkaExclusive(t) // it kills the broker: other Kafka tests wait
	report := e2e.RunCDC(t, opts)
	if mode == "long" {
		b, err := json.MarshalIndent(report, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll("results", 0o755))
		require.NoError(t, os.WriteFile(filepath.Join("results", "cdc-long.json"), append(b, '\n'), 0o644))
	}
}
