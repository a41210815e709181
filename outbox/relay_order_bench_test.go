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

// BenchmarkProducerOrderLock measures what a producer pays for a stronger order than the
// relay's default (docs/outbox-relay.md, The relay's order). Each transaction claims a message, writes one
// outbox row and commits, from 8 concurrent goroutines. "none" takes no extra lock: commit order
// per key holds only for producers that already serialise. "per-key" takes
// pg_advisory_xact_lock on one of 16 keys before the outbox write: commit order per key for
// every producer. "global" takes one advisory lock for all: commit order across all producers.
//
//	go test -run '^$' -bench ProducerOrderLock -benchtime 3000x ./outbox/
func BenchmarkProducerOrderLock(b *testing.B) {
	db := pgtest.OpenDB(b, 16)
	schema := pgtest.Schema(b, db)
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	claims := pgtx.QualifiedName(schema, "processed_messages")
	for _, mode := range []string{"none", "per-key", "global"} {
		b.Run(mode, func(b *testing.B) {
			var seq atomic.Int64
			run := pgtest.NewName(mode) // b.Run calls this function more than once
			b.SetParallelism(4)         // 8 goroutines on 2 CPUs
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					n := seq.Add(1)
					key := fmt.Sprintf("k%d", n%16)
					err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
						if _, err := tx.ExecContext(ctx, `INSERT INTO `+claims+` (consumer, message_id, payload_sha256) VALUES ($1, $2, '\x00')`, run, fmt.Sprint(n)); err != nil {
							return err
						}
						switch mode {
						case "per-key":
							if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, key); err != nil {
								return err
							}
						case "global":
							if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(0)`); err != nil {
								return err
							}
						}
						msg := message.NewMessage(fmt.Sprint(n), []byte(`{}`))
						msg.Metadata.Set("partition_key", key)
						return w.PublishTx(ctx, tx, "bench", msg)
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
		})
	}
}
