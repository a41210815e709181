package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// TestTinyRun runs the harness with a few hundred messages so that it cannot rot: every
// variant over the SQL broker, and the broker-specific paths (publishing, subscribing,
// cleaning up, the relay's publisher) over Kafka and RabbitMQ. Each variant must finish and
// pass its own checks (business rows, claims, inbox rows), and the result files must be
// written and readable. It measures nothing.
func TestTinyRun(t *testing.T) {
	db := pgtest.DB(t)
	schema := pgtest.NewName("wmonce_bench_test")
	pgtest.WatchOldTransactions(t, 5*time.Second) // a failure names what stalled the SQL reads
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = db.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(schema)+` CASCADE`)
	})
	if os.Getenv(broker.EnvKafkaBrokers) == "" {
		t.Log("Kafka: embedded kfake")
	}
	// The harness's output is long. It is logged only when the test fails, and after the
	// reason: a CI log that keeps only its head and tail still shows why.
	var outputs []string
	t.Cleanup(func() {
		if t.Failed() {
			t.Log("harness output:\n" + strings.Join(outputs, "\n"))
		}
	})
	tiny := func(t *testing.T, args ...string) *Report {
		t.Helper()
		o, err := parseFlags(append([]string{
			"-schema", schema, "-messages", "200", "-process-rows", "300", "-relay-rows", "200",
			"-inflight", "4", "-inbox-workers", "2", "-inbox-txbatch", "20", "-relay-lanes", "4",
			"-preload", "1000", "-c1-duration", "200ms", "-timeout", "90s", "-out", "",
			"-e2e-duration", "400ms", "-idle-window", "1s",
		}, args...))
		require.NoError(t, err)
		o.databaseURL = pgtest.URL()
		var out bytes.Buffer
		// Under -race beside the other packages the SQL run takes 3-4 times its 50 s alone.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		rep, err := run(ctx, o, &out)
		outputs = append(outputs, fmt.Sprintf("=== harness %v\n%s", args, out.String()))
		if err != nil {
			t.Fatalf("harness %v: %v", args, err)
		}
		var failed []string
		for _, r := range rep.Rounds {
			if r.Error != "" {
				failed = append(failed, fmt.Sprintf("round %d, %s over %s: %s", r.Round, r.Variant, r.Broker, r.Error))
			}
		}
		for _, r := range rep.Results {
			switch {
			case slices.Contains(idleVariants, r.Variant):
				if r.QueriesPerSec == nil {
					failed = append(failed, r.Variant+": no query rate")
				}
			case !(r.MsgsPerSec > 0):
				failed = append(failed, fmt.Sprintf("%s over %s: no throughput", r.Variant, r.Broker))
			}
		}
		if len(failed) > 0 {
			t.Fatalf("harness %v: %d variants failed:\n  %s", args, len(failed), strings.Join(failed, "\n  "))
		}
		return rep
	}
	has := func(rep *Report, variant, broker string) bool {
		return slices.ContainsFunc(rep.Results, func(r Result) bool { return r.Variant == variant && r.Broker == broker })
	}

	rep := tiny(t, "-brokers", "sql")
	for _, v := range []string{B0, B1, B2, B3, B4, B5Ingest, B6, Relay, RelayLane, Forwarder, E2E50, E2E1000} {
		require.True(t, has(rep, v, "sql"), "%s over sql missing", v)
	}
	for _, v := range idleVariants {
		require.True(t, has(rep, v, "postgres"), v)
	}
	require.Positive(t, rep.Config.Connections.Pool)
	require.LessOrEqual(t, rep.Config.Connections.Pool, rep.Config.Connections.Max-rep.Config.Connections.InUse)
	for _, v := range []string{B5Ingest, B5Process, C1Single, C1Batch} {
		require.True(t, has(rep, v, "postgres"), v)
	}
	require.NotEmpty(t, rep.Ratios)
	for _, r := range rep.Results {
		if r.Variant == B4 && r.Broker == "sql" {
			require.NotNil(t, r.BenchCPUms1k, "CPU per 1,000 messages of the bench process")
			require.NotNil(t, r.PGCPUms1k, "and of its PostgreSQL backends (PostgreSQL runs on this machine)")
		}
	}

	// A failing-handler variant (named only): the delayed retries go through the relay, and
	// every message, the failing fifth too, is applied once (the harness's check).
	failing := tiny(t, "-brokers", "sql", "-variants", FDelayedShort)
	require.True(t, has(failing, FDelayedShort, "sql"))

	var others *Report
	t.Run("kafka,amqp", func(t *testing.T) {
		if brokertest.RealKafka() != nil {
			// A shared lock on the cluster for as long as the harness uses it: the tests that
			// kill the broker (e2e, broker) take it exclusively, and in `go test ./...` they run
			// beside this one. Without it the harness once found the broker gone.
			brokertest.KafkaBrokers(t)
		}
		others = tiny(t, "-brokers", "kafka,amqp", "-variants", "B0,B4,B6,relay,forwarder,e2e-50", "-amqp-compare")
		for _, b := range []string{"kafka", "amqp", "amqp-p1c1"} {
			for _, v := range []string{B0, B4, Relay, Forwarder, E2E50} {
				require.True(t, has(others, v, b), "%s over %s missing", v, b)
			}
			require.False(t, has(others, B6, b), "B6 needs watermill-sql's subscriber")
		}
	})
	if others == nil {
		return
	}
	rep.Results = append(rep.Results, others.Results...)

	dir := t.TempDir()
	require.NoError(t, writeResults(dir, rep))
	js, err := os.ReadFile(filepath.Join(dir, "latest.json"))
	require.NoError(t, err)
	var back Report
	require.NoError(t, json.Unmarshal(js, &back))
	require.Len(t, back.Results, len(rep.Results))
	md, err := os.ReadFile(filepath.Join(dir, "latest.md"))
	require.NoError(t, err)
	require.True(t, strings.Contains(string(md), "| B4 |"), "markdown has the throughput table")
	require.True(t, strings.Contains(string(md), "## End-to-end latency"), "markdown has the latency table")
	require.True(t, strings.Contains(string(md), "## Idle query rate"), "markdown has the idle table")
	f, err := os.Open(filepath.Join(dir, "latest.png"))
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	require.Greater(t, img.Bounds().Dy(), 200)
	lf, err := os.Open(filepath.Join(dir, "latency.png"))
	require.NoError(t, err, "the e2e variants ran: the latency chart is written")
	defer lf.Close()
	limg, err := png.Decode(lf)
	require.NoError(t, err)
	require.Greater(t, limg.Bounds().Dy(), 100)
}

func TestFlagsRefuseBadInput(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-schema", "wmonce"},
		{"-schema", "Bench"},
		{"-brokers", "nats"},
		{"-variants", "B9"},
		{"-messages", "0"},
		{"-inflight", "0"},
		{"-e2e-sql-batch", "-1"},
		{"-e2e-partitions", "-3"},
	} {
		_, err := parseFlags(args)
		require.Error(t, err, "%v", args)
	}
	o, err := parseFlags([]string{"-quick"})
	require.NoError(t, err)
	require.Equal(t, 3000, o.messages)
	require.Equal(t, slices.DeleteFunc(slices.Clone(allVariants), func(v string) bool { return slices.Contains(namedOnlyVariants, v) }), o.variants)
	require.NotContains(t, o.variants, FRetry, "a failing-handler variant runs only when named")
	o, err = parseFlags([]string{"-variants", "f-retry,F-delayed"})
	require.NoError(t, err)
	require.Equal(t, []string{FRetry, FDelayed}, o.variants)
}

func TestPercentiles(t *testing.T) {
	t.Parallel()
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	p50, p99 := percentiles(lat)
	require.Equal(t, 50.0, p50)
	require.Equal(t, 99.0, p99)
}

// The median round of a throughput variant is the one with the median msgs/s; of an e2e
// variant, which runs at a fixed rate, the one with the median p50 latency.
func TestMediansPickTheMedianRoundOfWhatVaries(t *testing.T) {
	t.Parallel()
	round := func(variant string, i int, msgs, p50 float64) Result {
		return Result{Variant: variant, Broker: "sql", MsgsPerSec: msgs, P50ms: ms(p50), P99ms: ms(2 * p50), Round: i}
	}
	got := medians([]Result{
		round(E2E1000, 1, 1000, 17.4), round(B3, 1, 900, 3),
		round(E2E1000, 2, 999, 274.0), round(B3, 2, 1200, 2),
		round(E2E1000, 3, 1000, 8.8), round(B3, 3, 1000, 9),
	})
	require.Len(t, got, 2)
	require.Equal(t, 17.4, *got[0].P50ms)
	require.Contains(t, got[0].Notes, "p50 ms by round: 17.4, 274.0, 8.8")
	require.Equal(t, 1000.0, got[1].MsgsPerSec)
}
