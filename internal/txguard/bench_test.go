package txguard_test

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

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// BenchmarkGuardsInterleaved measures what each commit guard costs per message, in rounds that
// run every variant in turn (the order rotating each round), so that the load of a shared
// machine falls on all alike. A message is the middleware's transaction reduced to its
// statements: BEGIN, guard open, claim insert, handler insert, guard check, guard close, COMMIT.
// Variants: the guard on the wire (lazy BEGIN, what txguard.For picks on a pool from pgtx.Open),
// the server's guard on the same kind of pool, the server's guard without lazy BEGIN (what a
// plain pool gets), and no guard at all on a lazy-BEGIN pool (what a guard costs at all). A wire
// guard without lazy BEGIN does not exist: it lives in the lazy-BEGIN connection. It reports
// the median msgs/s and round trips per message of each variant and the median per-round ratio
// of each to the wire guard.
//
//	BENCH_ROUNDS=9 BENCH_MSGS=1000 BENCH_IN_FLIGHT=16 go test -run '^$' -bench GuardsInterleaved -benchtime 1x ./internal/txguard/
func BenchmarkGuardsInterleaved(b *testing.B) {
	inFlight, rounds, msgs := envInt("BENCH_IN_FLIGHT", 16), envInt("BENCH_ROUNDS", 7), envInt("BENCH_MSGS", 500)
	open := func(lazy bool) (*sql.DB, *pgtx.RoundTripCounter) {
		rt := &pgtx.RoundTripCounter{}
		db, err := pgtx.Open(context.Background(), pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: inFlight + 4, DisableLazyBegin: !lazy, RoundTrips: rt})
		if err != nil {
			b.Fatalf("%v\nStart PostgreSQL or set DATABASE_URL.", err)
		}
		b.Cleanup(func() { _ = db.Close() })
		return db, rt
	}
	setup := pgtest.OpenDB(b, 2)
	schema := pgtest.Schema(b, setup)
	claims, effects := pgtx.QualifiedName(schema, "bench_claims"), pgtx.QualifiedName(schema, "bench_effects")
	pgtest.Exec(b, setup, `CREATE TABLE `+claims+` (id text PRIMARY KEY)`)
	pgtest.Exec(b, setup, `CREATE TABLE `+effects+` (id bigserial PRIMARY KEY, key text NOT NULL, payload bytea NOT NULL)`)
	payload := make([]byte, 256)

	type variant struct {
		name  string
		db    *sql.DB
		rt    *pgtx.RoundTripCounter
		guard *txguard.Guard // nil: no guard
	}
	lazyWire, rtWire := open(true)
	lazyServer, rtServer := open(true)
	eager, rtEager := open(false)
	lazyNone, rtNone := open(true)
	wire, server, eagerGuard := txguard.For(schema, lazyWire), txguard.New(schema), txguard.For(schema, eager)
	if !wire.OnWire() || eagerGuard.OnWire() {
		b.Fatal("txguard.For picked the wrong guard")
	}
	variants := []variant{
		{"lazy-wire", lazyWire, rtWire, &wire},
		{"lazy-server", lazyServer, rtServer, &server},
		{"eager-server", eager, rtEager, &eagerGuard},
		{"lazy-none", lazyNone, rtNone, nil},
	}
	message := func(ctx context.Context, v variant, id string) error {
		tx, err := v.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if v.guard != nil {
			if err := v.guard.Open(ctx, tx); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+claims+` (id) VALUES ($1)`, id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+effects+` (key, payload) VALUES ($1, $2)`, id, payload); err != nil {
			return err
		}
		if v.guard != nil {
			if err := v.guard.Check(ctx, tx); err != nil {
				return err
			}
			if err := v.guard.Close(ctx, tx); err != nil {
				return err
			}
		}
		return tx.Commit()
	}
	rates := make([][]float64, len(variants))
	trips := make([][]float64, len(variants))
	var run atomic.Int64
	for _, v := range variants { // warm: connections, prepared statements
		throughput(b, inFlight, 4*inFlight, func(n int64) error {
			return message(context.Background(), v, fmt.Sprintf("warm-%s-%d", v.name, n))
		})
	}
	b.ResetTimer()
	for r := range rounds {
		for k := range variants {
			i := (k + r) % len(variants) // who goes first rotates
			v := variants[i]
			before := v.rt.Load()
			rates[i] = append(rates[i], throughput(b, inFlight, msgs, func(n int64) error {
				return message(context.Background(), v, fmt.Sprintf("%s-%d-%d", v.name, run.Add(1), n))
			}))
			trips[i] = append(trips[i], float64(v.rt.Load()-before)/float64(msgs))
		}
	}
	b.StopTimer()
	for i, v := range variants {
		b.ReportMetric(median(rates[i]), v.name+"-msgs/s")
		b.ReportMetric(median(trips[i]), v.name+"-trips/msg")
		if i == 0 {
			continue
		}
		ratios := make([]float64, rounds)
		faster := 0
		for r := range rounds {
			ratios[r] = rates[i][r] / rates[0][r]
			if ratios[r] > 1 {
				faster++
			}
		}
		b.ReportMetric(median(ratios), v.name+"/lazy-wire")
		b.Logf("%s/lazy-wire per round: %.2f (faster in %d of %d)", v.name, ratios, faster, rounds)
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

// throughput runs n calls of f from inFlight goroutines and returns calls per second.
func throughput(b *testing.B, inFlight, n int, f func(int64) error) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if err := f(i); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}
