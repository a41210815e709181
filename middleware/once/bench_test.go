package once_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// BenchmarkHandlerPaths compares, in one run, the ways a handler can write one business row per
// message with 64 messages in flight (as with many partitions; BENCH_IN_FLIGHT changes it):
// without dedupe (at-least-once),
// with the per-message effectively-once transaction, and with group commit. Compare ns/op
// across sub-benchmarks of the same run; the machine is shared and noisy.
//
//	go test -run '^$' -bench HandlerPaths -benchtime 5000x ./middleware/once/
func BenchmarkHandlerPaths(b *testing.B) {
	db := pgtest.OpenDB(b, 80)
	schema := pgtest.Schema(b, db)
	effects := pgtx.QualifiedName(schema, "effects")
	pgtest.Exec(b, db, `CREATE TABLE `+effects+` (id bigserial PRIMARY KEY, key text NOT NULL, payload bytea NOT NULL)`)
	payload := make([]byte, 256)
	insert := `INSERT INTO ` + effects + ` (key, payload) VALUES ($1, $2)`
	business := func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgtx.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), insert, msg.UUID, msg.Payload)
		return nil, err
	}
	inFlight := 64
	if v, err := strconv.Atoi(os.Getenv("BENCH_IN_FLIGHT")); err == nil && v > 0 {
		inFlight = v
	}
	var run atomic.Int64
	eager, err := pgtx.Open(context.Background(), pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 80, DisableLazyBegin: true})
	if err != nil {
		b.Fatal(err)
	}
	defer eager.Close()

	for _, pool := range []struct {
		name string
		db   *sql.DB
	}{{"", db}, {"-eager-begin", eager}} {
		b.Run("no-dedupe"+pool.name, func(b *testing.B) {
			h := func(msg *message.Message) ([]*message.Message, error) {
				return nil, pgtx.RunInTx(context.Background(), pool.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, insert, msg.UUID, msg.Payload)
					return err
				})
			}
			drive(b, h, inFlight, payload, run.Add(1))
		})
		b.Run("per-message"+pool.name, func(b *testing.B) {
			mw, err := once.New(pool.db, once.Config{Schema: schema, Consumer: "bench", GroupCommit: once.GroupCommitConfig{Disabled: true}}, nil)
			if err != nil {
				b.Fatal(err)
			}
			drive(b, mw.Middleware(business), inFlight, payload, run.Add(1))
		})
	}
	for _, workers := range []int{2, 4, 8} {
		gc := once.GroupCommitConfig{Workers: workers}
		b.Run(fmt.Sprintf("group-commit-workers-%d", workers), func(b *testing.B) {
			mw, err := once.New(db, once.Config{Schema: schema, Consumer: "bench", GroupCommit: gc}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer mw.Close()
			drive(b, mw.Middleware(business), inFlight, payload, run.Add(1))
			c := mw.Counters()
			txs, msgs := c.GroupCommitTransactions, c.GroupCommitMessages
			if txs > 0 {
				b.ReportMetric(float64(msgs)/float64(txs), "msgs/tx")
			}
		})
	}
}

// drive pushes b.N unique messages through h from inFlight goroutines.
func drive(b *testing.B, h message.HandlerFunc, inFlight int, payload []byte, run int64) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if _, err := h(message.NewMessage(fmt.Sprintf("r%d-%d", run, i), payload)); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkHandlerPathsInterleaved measures the same paths as BenchmarkHandlerPaths, but in
// rounds that run every variant in turn (BENCH_ROUNDS rounds of BENCH_MSGS messages each), so
// that the load of a shared machine falls on all of them alike. It reports the median msgs/s of
// each variant and the median over rounds of each variant's ratio to per-message and of
// per-message to no-dedupe. Run it once per setting:
//
//	BENCH_IN_FLIGHT=64 go test -run '^$' -bench HandlerPathsInterleaved -benchtime 1x ./middleware/once/
func BenchmarkHandlerPathsInterleaved(b *testing.B) {
	db := pgtest.OpenDB(b, 80)
	schema := pgtest.Schema(b, db)
	effects := pgtx.QualifiedName(schema, "effects")
	pgtest.Exec(b, db, `CREATE TABLE `+effects+` (id bigserial PRIMARY KEY, key text NOT NULL, payload bytea NOT NULL)`)
	eager, err := pgtx.Open(context.Background(), pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 80, DisableLazyBegin: true})
	if err != nil {
		b.Fatal(err)
	}
	defer eager.Close()
	payload := make([]byte, 256)
	insert := `INSERT INTO ` + effects + ` (key, payload) VALUES ($1, $2)`
	business := func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgtx.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), insert, msg.UUID, msg.Payload)
		return nil, err
	}
	atLeastOnce := func(db *sql.DB) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			return nil, pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, insert, msg.UUID, msg.Payload)
				return err
			})
		}
	}
	var groupStats []func() (uint64, uint64)
	mw := func(db *sql.DB, gc once.GroupCommitConfig) message.HandlerFunc {
		m, err := once.New(db, once.Config{Schema: schema, Consumer: "bench", GroupCommit: gc}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close() })
		if !gc.Disabled {
			groupStats = append(groupStats, func() (uint64, uint64) {
				c := m.Counters()
				return c.GroupCommitTransactions, c.GroupCommitMessages
			})
		}
		return m.Middleware(business)
	}
	variants := []struct {
		name string
		h    message.HandlerFunc
	}{
		{"no-dedupe", atLeastOnce(db)},
		{"per-message", mw(db, once.GroupCommitConfig{Disabled: true})},
		{"no-dedupe-eager-begin", atLeastOnce(eager)},
		{"per-message-eager-begin", mw(eager, once.GroupCommitConfig{Disabled: true})},
		{"group-commit-2", mw(db, once.GroupCommitConfig{})}, // the default
		{"group-commit-4", mw(db, once.GroupCommitConfig{Workers: 4})},
		// The same as per-message, last in each round: how far apart two identical variants land.
		{"per-message-control", mw(db, once.GroupCommitConfig{Disabled: true})},
	}
	inFlight, rounds, msgs := envInt("BENCH_IN_FLIGHT", 64), envInt("BENCH_ROUNDS", 7), envInt("BENCH_MSGS", 500)
	rates := make([][]float64, len(variants))
	var run int64
	for range rounds {
		for i, v := range variants {
			run++
			rates[i] = append(rates[i], throughput(b, v.h, inFlight, msgs, payload, run))
		}
	}
	b.StopTimer()
	for i, v := range variants {
		b.ReportMetric(median(rates[i]), v.name+"-msgs/s")
		if i != 1 {
			ratios := make([]float64, rounds)
			for r := range rounds {
				ratios[r] = rates[i][r] / rates[1][r]
			}
			b.ReportMetric(median(ratios), v.name+"/per-message")
		}
	}
	ratios := make([]float64, rounds)
	for r := range rounds {
		ratios[r] = rates[1][r] / rates[0][r]
	}
	b.ReportMetric(median(ratios), "per-message/no-dedupe")
	for r := range rounds {
		ratios[r] = rates[3][r] / rates[2][r]
	}
	b.ReportMetric(median(ratios), "eager:per-message/no-dedupe")
	for r := range rounds { // the default (group commit, Workers 2) against at-least-once: B4/B1
		ratios[r] = rates[4][r] / rates[0][r]
	}
	b.ReportMetric(median(ratios), "default/no-dedupe")
	for i, stats := range groupStats {
		if txs, msgs := stats(); txs > 0 {
			b.ReportMetric(float64(msgs)/float64(txs), fmt.Sprintf("group-%d-msgs/tx", i))
		}
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// throughput pushes n unique messages through h from inFlight goroutines and returns msgs/s.
func throughput(b *testing.B, h message.HandlerFunc, inFlight, n int, payload []byte, run int64) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if _, err := h(message.NewMessage(fmt.Sprintf("i%d-%d", run, i), payload)); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}
