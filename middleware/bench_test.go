package middleware_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware"
	"github.com/wmonce/watermill-once/pgtx"
)

// BenchmarkHandlerPaths compares, in one run, the ways a handler can write one business row per
// message with 64 messages in flight (as with many partitions; BENCH_IN_FLIGHT changes it):
// without dedupe (at-least-once),
// with the per-message effectively-once transaction, and with group commit. Compare ns/op
// across sub-benchmarks of the same run; the machine is shared and noisy.
//
//	go test -run '^$' -bench HandlerPaths -benchtime 5000x ./middleware/
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
			mw, err := middleware.NewEffectivelyOnce(pool.db, middleware.Config{Schema: schema, Consumer: "bench"}, nil)
			if err != nil {
				b.Fatal(err)
			}
			drive(b, mw.Middleware(business), inFlight, payload, run.Add(1))
		})
	}
	for _, workers := range []int{2, 4, 8} {
		gc := middleware.GroupCommitConfig{Enabled: true, Workers: workers}
		b.Run(fmt.Sprintf("group-commit-workers-%d", workers), func(b *testing.B) {
			mw, err := middleware.NewEffectivelyOnce(db, middleware.Config{Schema: schema, Consumer: "bench", GroupCommit: gc}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer mw.Close()
			drive(b, mw.Middleware(business), inFlight, payload, run.Add(1))
			txs, msgs := mw.GroupCommitStats()
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
