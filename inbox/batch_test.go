package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// A batch handler in the Processor gets a transaction's rows together, once, and writes them
// with one statement; a row it fails fails alone (the batch falls back to one row per
// transaction), and nothing of its first batch commits.
func TestProcessorRunsABatchHandlerOncePerTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	var calls [][]string
	bad := errors.New("row m-7 is invalid")
	h := once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.UUID
		}
		mu.Lock()
		calls = append(calls, ids)
		mu.Unlock()
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+e.table("effects")+` (message_id) SELECT unnest($1::text[])`, ids); err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.UUID == "m-7" { // its row was written above: it must not commit
				return nil, &once.BatchError{Failed: map[*message.Message]error{m: wmonce.Permanent(bad)}}
			}
		}
		return nil, nil
	})
	var msgs []*message.Message
	for i := range 40 {
		msgs = append(msgs, msg(fmt.Sprintf("m-%d", i), "{}"))
	}
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	storeAll(t, e, r, msgs)
	cfg := fast("c")
	cfg.Workers, cfg.TxBatchSize, cfg.BatchSize = 1, 20, 40
	p := e.start(t, h, cfg)
	p.until(t, "every row settled", func(s tally) bool { return s.Done+s.Parked+s.Failed >= 40 })

	require.Equal(t, 39, e.status(t, "c", inbox.StatusDone))
	require.Equal(t, 1, e.status(t, "c", inbox.StatusFailed))
	require.Equal(t, 39, e.effects(t), "each good row's write once, none of m-7's")
	require.Equal(t, 39, pgtest.Count(t, e.db, `SELECT count(DISTINCT message_id) FROM `+e.table("effects")))
	mu.Lock()
	defer mu.Unlock()
	t.Logf("calls: %v", calls)
	require.True(t, slices.ContainsFunc(calls, func(c []string) bool { return len(c) == 20 && !slices.Contains(c, "m-7") }),
		"a transaction's 20 rows reached the batch function in one call")
}

// A batch's rows are counted per row exactly as a per-message handler's rows in the same
// transactions are (ProcessorCounters, the metrics package's source): the failed batch falls
// back to one row per transaction on both paths.
func TestProcessorCountsABatchsRowsAsThePerMessagePathDoes(t *testing.T) {
	t.Parallel()
	bad := errors.New("row m-7 is invalid")
	run := func(t *testing.T, batch bool) inbox.ProcessorCounters {
		e := newEnv(t)
		write := func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) error {
			ids := make([]string, len(msgs))
			for i, m := range msgs {
				ids[i] = m.UUID
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO `+e.table("effects")+` (message_id) SELECT unnest($1::text[])`, ids)
			for _, m := range msgs {
				if m.UUID == "m-7" {
					return wmonce.Permanent(bad)
				}
			}
			return err
		}
		h := func(m *message.Message) ([]*message.Message, error) {
			tx, _ := pgtx.TxFromContext(m.Context())
			return nil, write(m.Context(), tx, []*message.Message{m})
		}
		if batch {
			h = once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
				return nil, write(ctx, tx, msgs)
			})
		}
		var msgs []*message.Message
		for i := range 12 {
			msgs = append(msgs, msg(fmt.Sprintf("m-%d", i), "{}"))
		}
		r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
		storeAll(t, e, r, msgs)
		cfg := fast("c")
		cfg.Workers, cfg.TxBatchSize, cfg.BatchSize = 1, 6, 12
		p := e.start(t, h, cfg)
		p.until(t, "every row settled", func(s tally) bool { return s.Done+s.Parked+s.Failed >= 12 })
		require.Equal(t, 11, e.effects(t))
		return p.Counters()
	}
	perMessage, batched := run(t, false), run(t, true)
	require.Equal(t, uint64(11), batched.Processed)
	require.Equal(t, uint64(1), batched.Parked)
	require.Equal(t, perMessage, batched)
}

// Each row keeps its consumer span; each run of the batch function is a span "once batch"
// linked to the spans of the rows it applied, as on the router (middleware/once).
func TestProcessorBatchSpanIsLinkedToEachRowsSpan(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := tracetest.NewSpanRecorder()
	h := once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		for _, m := range msgs {
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+e.table("effects")+` (message_id) VALUES ($1)`, m.UUID); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	storeAll(t, e, r, []*message.Message{msg("m-0", "{}"), msg("m-1", "{}"), msg("m-2", "{}")})
	cfg := fast("c")
	cfg.Workers, cfg.TxBatchSize, cfg.BatchSize = 1, 3, 3
	cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	p := e.start(t, h, cfg)
	p.until(t, "every row done", func(s tally) bool { return s.Done >= 3 })
	rows := map[trace.SpanID]string{}
	var batches []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "inbox process":
			for _, a := range s.Attributes() {
				if a.Key == "wmonce.dedupe_key" {
					rows[s.SpanContext().SpanID()] = a.Value.AsString()
				}
			}
		case "once batch":
			batches = append(batches, s)
		}
	}
	require.Len(t, rows, 3)
	require.Len(t, batches, 1, "the transaction's three rows ran in one batch")
	var linked []string
	for _, l := range batches[0].Links() {
		linked = append(linked, rows[l.SpanContext.SpanID()])
	}
	require.ElementsMatch(t, []string{"m-0", "m-1", "m-2"}, linked)
	require.Contains(t, batches[0].Attributes(), attribute.Int("wmonce.batch_size", 3))
}
