package inbox_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// BenchmarkIngest measures the receiver under many concurrent deliveries (as from many
// partitions or a router with many handlers in flight): each op is one Handle call that
// returns after its row committed.
//
//	go test -run '^$' -bench Ingest -benchtime 100000x ./inbox/
func BenchmarkIngest(b *testing.B) {
	for _, writers := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			e := newEnvOn(b, pgtest.OpenDB(b, writers+2))
			r := e.receiver(b, inbox.ReceiverConfig{Consumer: "bench", Workers: writers})
			payload := []byte(`{"payment_id":"p-1","amount_paise":120000,"currency":"INR"}`)
			var seq atomic.Int64
			b.SetParallelism(64) // 64 x GOMAXPROCS concurrent deliveries
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					m := message.NewMessage("m-"+strconv.FormatInt(seq.Add(1), 10), payload)
					m.Metadata.Set("event_type", "PaymentCaptured")
					if err := r.Handle(m); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			c := r.Counters()
			b.ReportMetric(float64(c.Stored)/float64(max(c.Batches, 1)), "rows/batch")
		})
	}
}

// BenchmarkProcess measures the processor working a backlog of b.N rows; each handler writes
// one row of its own in the processing transaction (noop-handler: writes nothing, to show the
// inbox's own cost).
//
//	go test -run '^$' -bench Process -benchtime 50000x ./inbox/
func BenchmarkProcess(b *testing.B) {
	for _, bc := range []struct {
		workers, claim, txBatch int
		noop                    bool
	}{
		{4, 16, 1, false},
		{8, 16, 1, false},
		{4, 100, 50, false},
		{2, 500, 250, false},
		{4, 100, 50, true},
	} {
		name := fmt.Sprintf("workers=%d/claim=%d/txbatch=%d", bc.workers, bc.claim, bc.txBatch)
		if bc.noop {
			name += "/noop-handler"
		}
		b.Run(name, func(b *testing.B) {
			e := newEnvOn(b, pgtest.OpenDB(b, bc.workers+4))
			r := e.receiver(b, inbox.ReceiverConfig{Consumer: "bench"})
			ctx := context.Background()
			payload := []byte(`{"payment_id":"p-1","amount_paise":120000,"currency":"INR"}`)
			for start := 0; start < b.N; start += 1000 {
				msgs := make([]*message.Message, 0, 1000)
				for i := start; i < min(start+1000, b.N); i++ {
					msgs = append(msgs, message.NewMessage("m-"+strconv.Itoa(i), payload))
				}
				tx, err := e.db.BeginTx(ctx, nil)
				require.NoError(b, err)
				_, err = r.StoreTx(ctx, tx, "payments", msgs...)
				require.NoError(b, err)
				require.NoError(b, tx.Commit())
			}
			cfg := inbox.ProcessorConfig{Consumer: "bench", Workers: bc.workers, BatchSize: bc.claim, TxBatchSize: bc.txBatch}
			p := e.processor(b, func(m *message.Message) ([]*message.Message, error) {
				if bc.noop {
					return nil, nil
				}
				return nil, e.effect(m, "w")
			}, cfg)
			settled := &p.TestSignals().Settled // read as it comes, so it never fills up
			settled.Init()
			b.ResetTimer()
			e.run(b, p)
			for done := 0; done < b.N; {
				if settled.WaitOrTimeout().As == inbox.SettledDone {
					done++
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			if !bc.noop {
				require.Equal(b, b.N, e.effects(b))
			}
		})
	}
}

// BenchmarkProcessClaimModesInterleaved works a backlog of BENCH_ROWS rows with leases and with
// ClaimLock in turn, BENCH_ROUNDS times, with the e2e bench's settings (8 workers, TxBatchSize
// 200, PollInterval 50ms), and reports each mode's median msgs/s and the median ratio
// lock/lease per round, so that a shared machine's load falls on both alike. The mode that goes
// first alternates from round to round, so that neither always runs on the fresher table.
// BENCH_WORKERS and BENCH_TXBATCH change the workers and TxBatchSize (BENCH_TXBATCH=1
// BENCH_WORKERS=4: the defaults):
//
//	BENCH_ROUNDS=5 BENCH_ROWS=10000 go test -run '^$' -bench ProcessClaimModesInterleaved -benchtime 1x ./inbox/
func BenchmarkProcessClaimModesInterleaved(b *testing.B) {
	rounds, rows := envInt(b, "BENCH_ROUNDS", 3), envInt(b, "BENCH_ROWS", 10000)
	workers, txBatch := envInt(b, "BENCH_WORKERS", 8), envInt(b, "BENCH_TXBATCH", 200)
	e := newEnvOn(b, pgtest.OpenDB(b, 40))
	payload := []byte(`{"payment_id":"p-1","amount_paise":120000,"currency":"INR"}`)
	modes := []struct {
		name string
		mode inbox.ClaimMode
	}{{"lease", inbox.ClaimLease}, {"lock", inbox.ClaimLock}}
	rates := make([][]float64, len(modes))
	seq := 0
	for round := range rounds {
		for k := range modes {
			i := (k + round) % len(modes)
			m := modes[i]
			consumer := fmt.Sprintf("bench-%s-%d", m.name, round)
			ctx := context.Background()
			r := e.receiver(b, inbox.ReceiverConfig{Consumer: consumer})
			for start := 0; start < rows; start += 1000 {
				msgs := make([]*message.Message, 0, 1000)
				for range min(1000, rows-start) {
					seq++
					msgs = append(msgs, message.NewMessage("m-"+strconv.Itoa(seq), payload))
				}
				tx, err := e.db.BeginTx(ctx, nil)
				require.NoError(b, err)
				_, err = r.StoreTx(ctx, tx, "payments", msgs...)
				require.NoError(b, err)
				require.NoError(b, tx.Commit())
			}
			cfg := inbox.ProcessorConfig{Consumer: consumer, Workers: workers, BatchSize: 2 * txBatch, TxBatchSize: txBatch, PollInterval: 50 * time.Millisecond, ClaimMode: m.mode}
			if m.mode == inbox.ClaimLock {
				cfg.BatchSize = 0
			}
			p := e.processor(b, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "w") }, cfg)
			settled := &p.TestSignals().Settled
			settled.Init()
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx) }()
			for n := 0; n < rows; {
				if settled.WaitOrTimeout().As == inbox.SettledDone {
					n++
				}
			}
			el := time.Since(start)
			require.NoError(b, p.Close())
			require.NoError(b, <-done)
			rates[i] = append(rates[i], float64(rows)/el.Seconds())
		}
	}
	b.StopTimer()
	ratios := make([]float64, rounds)
	for i, m := range modes {
		b.ReportMetric(medianOf(rates[i]), m.name+"-msgs/s")
	}
	for r := range rounds {
		ratios[r] = rates[1][r] / rates[0][r]
	}
	b.ReportMetric(medianOf(ratios), "lock/lease")
	b.Logf("msgs/s by round: lease %.0f, lock %.0f", rates[0], rates[1])
}

func envInt(b *testing.B, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err, name)
		return n
	}
	return def
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
