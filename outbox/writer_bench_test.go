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
// concurrent ones ("parallel"). Variants: "plain" never notifies (the baseline), "always"
// notifies at every commit, "busy" is the Writer while no relay asked to be woken (it checks
// outbox_offsets.idle_until and sends nothing), "idle" the Writer while a relay waits (it
// notifies). The variants alternate in one run, so compare them within it.
//
//	go test -run '^$' -bench WriterNotify -benchtime 2000x -count 3 ./outbox/
func BenchmarkWriterNotify(b *testing.B) {
	db := pgtest.OpenDB(b, 16)
	schema := pgtest.Schema(b, db)
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	if _, err := db.Exec(`INSERT INTO ` + offsets + ` (consumer_group, offset_acked, last_processed_transaction_id, snapshot) VALUES ('relay', 0, '1', '1:1:')`); err != nil {
		b.Fatal(err)
	}
	idle := func(on bool) {
		q := `UPDATE ` + offsets + ` SET idle_until = NULL`
		if on {
			q = `UPDATE ` + offsets + ` SET idle_until = now() + interval '1 hour'`
		}
		if _, err := db.Exec(q); err != nil {
			b.Fatal(err)
		}
	}
	writers := map[string]*outbox.Writer{"plain": outbox.WriterWithoutNotify(w), "always": outbox.WriterAlwaysNotify(w), "busy": w, "idle": w}
	var seq atomic.Int64
	store := func(ctx context.Context, w *outbox.Writer) error {
		return pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
			return w.PublishTx(ctx, tx, "bench", message.NewMessage(fmt.Sprint(seq.Add(1)), []byte(`{}`)))
		})
	}
	for _, conc := range []string{"serial", "parallel"} {
		for _, variant := range []string{"plain", "always", "busy", "idle"} {
			w := writers[variant]
			idle(variant == "idle")
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
