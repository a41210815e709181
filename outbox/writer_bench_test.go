package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// BenchmarkWriterNotify measures what waking the relay costs a producer: each transaction
// stores one message with PublishTx and commits, from 1 goroutine ("serial") and from 8
// concurrent ones ("parallel"), with the writer's pg_notify ("notify") and without it
// ("plain"). The variants alternate in one run, so compare them within it.
//
//	go test -run '^$' -bench WriterNotify -benchtime 2000x -count 3 ./outbox/
func BenchmarkWriterNotify(b *testing.B) {
	db := pgtest.OpenDB(b, 16)
	schema := pgtest.Schema(b, db)
	notify, err := outbox.NewWriter(outbox.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	plain := outbox.WriterWithoutNotify(notify)
	var seq atomic.Int64
	store := func(ctx context.Context, w *outbox.Writer) error {
		return pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
			return w.PublishTx(ctx, tx, "bench", message.NewMessage(fmt.Sprint(seq.Add(1)), []byte(`{}`)))
		})
	}
	for _, conc := range []string{"serial", "parallel"} {
		for _, variant := range []string{"plain", "notify"} {
			w := plain
			if variant == "notify" {
				w = notify
			}
			b.Run(conc+"/"+variant, func(b *testing.B) {
				ctx := context.Background()
				if conc == "serial" {
					for range b.N {
						if err := store(ctx, w); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					b.SetParallelism(4) // 8 goroutines on 2 CPUs
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := store(ctx, w); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
			})
		}
	}
}
