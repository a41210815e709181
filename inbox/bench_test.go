package inbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

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
