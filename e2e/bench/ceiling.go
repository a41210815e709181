package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// ceiling is C1: how fast PostgreSQL takes claims with nothing else around them, from many
// clients at once, one row per statement (each its own transaction) or 100 per statement.
func (h *harness) ceiling(ctx context.Context, id string) (Result, error) {
	clients := h.opts.inFlight
	per := 1
	if id == C1Batch {
		per = 100
	}
	res := Result{Variant: id, Broker: "postgres", InFlight: clients}
	table := pgtx.QualifiedName(h.opts.schema, "processed_messages")
	const consumer = "bench-c1"
	single := `INSERT INTO ` + table + ` (consumer, message_id, payload_sha256) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`
	many := `INSERT INTO ` + table + ` (consumer, message_id, payload_sha256)
SELECT $1, k, s FROM unnest($2::text[], $3::bytea[]) AS x(k, s) ON CONFLICT DO NOTHING`
	sum := sha256.Sum256(payload(0))

	var rows atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	runCtx, cancel := context.WithTimeout(ctx, h.opts.c1Duration)
	defer cancel()
	meas := h.startMeasuring("postgres-" + id)
	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			var mine []time.Duration
			keys := make([]string, per)
			sums := make([][]byte, per)
			for runCtx.Err() == nil {
				for i := range keys {
					keys[i], sums[i] = newUUID(), sum[:]
				}
				t := time.Now()
				var err error
				if per == 1 {
					_, err = h.db.ExecContext(ctx, single, consumer, keys[0], sums[0])
				} else {
					_, err = h.db.ExecContext(ctx, many, consumer, keys, sums)
				}
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t))
				rows.Add(int64(per))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	el := time.Since(start)
	meas.stop(&res)
	if firstErr != nil {
		return res, firstErr
	}
	res.Messages = int(rows.Load())
	meas.cpuPerMessage(&res)
	res.Seconds = el.Seconds()
	res.MsgsPerSec = float64(rows.Load()) / el.Seconds()
	p50, p99 := percentiles(lat)
	res.P50ms, res.P99ms = ms(p50), ms(p99)
	res.Notes = fmt.Sprintf("%d clients for %s; latency per statement (%d rows), autocommit", clients, h.opts.c1Duration, per)
	var claimed int
	if err := h.db.QueryRowContext(ctx, `SELECT count(*) FROM `+table+` WHERE consumer = $1`, consumer).Scan(&claimed); err != nil {
		return res, err
	}
	if claimed != res.Messages {
		return res, fmt.Errorf("CHECK FAILED: %d claims stored, %d inserted", claimed, res.Messages)
	}
	return res, cleanSchema(ctx, h.db, h.opts.schema)
}
