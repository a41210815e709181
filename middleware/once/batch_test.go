package once_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// batchEnv is a middleware with one lane, so that messages delivered while a "busy" one holds
// it form one group, and records of every batch its batch function is given.
type batchEnv struct {
	*env
	busy    chan struct{} // the batch function got "busy"
	release chan struct{} // lets "busy" finish

	mu      sync.Mutex
	batches [][]string // the UUIDs of each call of the batch function, in order
}

func newBatchEnv(t *testing.T, adjust ...func(*once.Config)) *batchEnv {
	t.Helper()
	cfg := once.Config{Consumer: "c", OutputTopic: "out"}
	for _, a := range adjust {
		a(&cfg)
	}
	cfg.GroupCommit = once.GroupCommitConfig{Workers: 1, TxBatchSize: 50}
	e := &batchEnv{env: newEnv(t, cfg), busy: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(func() { _ = e.mw.Close() })
	return e
}

// writeAll records the batch and does its business write: one multi-row INSERT for every
// message, and one output per message.
func (e *batchEnv) writeAll(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
	uuids := make([]string, len(msgs))
	out := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		uuids[i] = m.UUID
		out[i] = message.NewMessage("out-"+m.UUID, []byte(`{}`))
	}
	e.mu.Lock()
	e.batches = append(e.batches, uuids)
	e.mu.Unlock()
	if slices.Contains(uuids, "busy") {
		e.busy <- struct{}{}
		<-e.release // holds the only lane while a group forms
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO `+e.table("effects")+` (key, amount) SELECT unnest($1::text[]), 1`, uuids)
	return out, err
}

func (e *batchEnv) calls() [][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.batches)
}

// group delivers "busy" (alone: it holds the lane), then uuids into the queue one after
// another, releases the lane and returns each delivery's outcome (busy's first): uuids ran as
// one group.
func (e *batchEnv) group(t *testing.T, h message.HandlerFunc, uuids ...string) []error {
	t.Helper()
	signals := once.GroupCommitTestSignals(e.mw)
	errs := make([]error, len(uuids)+1)
	var wg sync.WaitGroup
	run := func(i int, uuid string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = deliver(h, uuid, "p")
		}()
	}
	run(0, "busy")
	testwait.Receive(t, e.busy, "busy holds the lane")
	for i, u := range uuids {
		run(i+1, u)
		require.Equal(t, i+1, signals.Queued.WaitOrTimeout(), "%s waits", u)
	}
	close(e.release)
	wg.Wait()
	return errs
}

func keys(prefix string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

func TestBatchHandlerGetsTheGroupsFreshMessagesOnce(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t)
	h := e.mw.Middleware(once.BatchHandler(e.writeAll))
	// Applied before, each alone: a batch of one.
	for _, u := range keys("m", 5) {
		require.NoError(t, deliver(h, u, "p"))
	}
	// m-0..m-9 and a second copy of m-5..m-9, in one group.
	uuids := append(keys("m", 10), keys("m", 10)[5:]...)
	for i, err := range e.group(t, h, uuids...) {
		require.NoError(t, err, "delivery %d", i)
	}
	calls := e.calls()
	require.Equal(t, [][]string{{"m-0"}, {"m-1"}, {"m-2"}, {"m-3"}, {"m-4"}, {"busy"}, keys("m", 10)[5:]}, calls,
		"the group's fresh messages reached the batch function together, once; no copy reached it")
	require.Equal(t, 11, e.effects(t))
	require.Equal(t, 11, pgtest.Count(t, e.db, `SELECT count(DISTINCT key) FROM `+e.table("effects")))
	require.Equal(t, 11, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))
	c := e.mw.Counters().Consumer("c")
	require.Equal(t, uint64(11), c.Fresh)
	require.Equal(t, uint64(10), c.Duplicates, "five applied before, five copies in the group")
}

func TestBatchHandlerBisectsAFailedBatchToTheMessageAtFault(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t)
	signals := once.GroupCommitTestSignals(e.mw)
	h := e.mw.Middleware(once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		out, err := e.writeAll(ctx, tx, msgs) // the poison's batch writes every row, then fails
		if err == nil && slices.ContainsFunc(msgs, func(m *message.Message) bool { return m.UUID == "m-5" }) {
			return nil, errors.New("poison in the batch")
		}
		return out, err
	}))
	errs := e.group(t, h, keys("m", 8)...)
	for i, err := range errs[1:] {
		if i == 5 {
			require.ErrorContains(t, err, "poison in the batch")
			continue
		}
		require.NoError(t, err, "m-%d", i)
	}
	require.Equal(t, "m-5", signals.Isolated.WaitOrTimeout(), "the poison was answered alone")
	require.Empty(t, signals.Isolated.C(), "and nothing else was")
	require.Equal(t, 8, e.effects(t), "busy and the seven good messages, once each")
	require.Equal(t, 8, pgtest.Count(t, e.db, `SELECT count(DISTINCT key) FROM `+e.table("effects")))
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE key = 'm-5'`))
	require.Equal(t, 8, e.claims(t), "the poison left no claim")
	require.Equal(t, 8, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))
	t.Logf("batches: %v", e.calls())
	require.Len(t, e.calls(), 1+7, "busy, the group of 8, then halves: [0-3] ok, [4-7], [4-5], [4], [5] alone, [6-7]")
}

func TestBatchErrorFailsOnlyTheMessagesItNames(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t)
	signals := once.GroupCommitTestSignals(e.mw)
	bad := errors.New("m-3 is invalid")
	h := e.mw.Middleware(once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		out, err := e.writeAll(ctx, tx, msgs) // writes m-3's row too: it must not commit
		for _, m := range msgs {
			if m.UUID == "m-3" {
				return nil, &once.BatchError{Failed: map[*message.Message]error{m: bad}}
			}
		}
		return out, err
	}))
	errs := e.group(t, h, keys("m", 6)...)
	for i, err := range errs[1:] {
		if i == 3 {
			require.ErrorIs(t, err, bad)
			continue
		}
		require.NoError(t, err, "m-%d", i)
	}
	require.Equal(t, "m-3", signals.Isolated.WaitOrTimeout())
	require.Equal(t, [][]string{{"busy"}, keys("m", 6), {"m-0", "m-1", "m-2", "m-4", "m-5"}}, e.calls(),
		"the rest ran again without m-3, in a new transaction")
	require.Equal(t, 6, e.effects(t))
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE key = 'm-3'`))
	require.Equal(t, 6, e.claims(t))
	require.Equal(t, uint64(1), e.mw.Counters().Consumer("c").Failed)

	// Alone (a lane free), a batch of one: the error it names is the message's.
	require.ErrorIs(t, deliver(h, "m-3", "p"), bad)
	require.Equal(t, 6, e.effects(t))
}

func TestBatchHandlerEndingTheTxTouchesNoNeighbour(t *testing.T) {
	t.Parallel()
	for _, ending := range pgtest.TxEndings {
		t.Run(ending.Name, func(t *testing.T) {
			t.Parallel()
			e := newBatchEnv(t)
			h := e.mw.Middleware(once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
				out, err := e.writeAll(ctx, tx, msgs)
				if slices.ContainsFunc(msgs, func(m *message.Message) bool { return m.UUID == "m-3" }) {
					ending.End(tx)
					_, _ = tx.ExecContext(ctx, `INSERT INTO `+e.table("effects")+` (key, amount) VALUES ('after-end', 1)`)
				}
				return out, err
			}))
			errs := e.group(t, h, keys("m", 6)...)
			for i, err := range errs[1:] {
				if i == 3 {
					require.ErrorIs(t, err, wmonce.ErrHandlerEndedTx)
					require.True(t, wmonce.IsPermanent(err))
					continue
				}
				require.NoError(t, err, "m-%d", i)
			}
			require.Equal(t, 6, e.effects(t), "busy and five, once each; nothing of m-3's batches")
			require.Equal(t, 6, pgtest.Count(t, e.db, `SELECT count(DISTINCT key) FROM `+e.table("effects")))
			require.Equal(t, 6, e.claims(t))
			require.Equal(t, 6, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))
			require.Equal(t, uint64(1), e.mw.Counters().Consumer("c").HandlerEndedTx)
		})
	}
}

func TestBatchHandlerAckingItsMessagesSettlesNoDelivery(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t)
	h := e.mw.Middleware(once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		for _, m := range msgs {
			m.Ack()
		}
		return e.writeAll(ctx, tx, msgs)
	}))
	signals := once.GroupCommitTestSignals(e.mw)
	deliveries := map[string]*message.Message{}
	var wg sync.WaitGroup
	for i, u := range append([]string{"busy"}, keys("m", 4)...) {
		msg := message.NewMessage(u, []byte("p"))
		deliveries[u] = msg
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := h(msg)
			require.NoError(t, err)
		}()
		if i == 0 {
			testwait.Receive(t, e.busy, "busy holds the lane")
		} else {
			require.Equal(t, i, signals.Queued.WaitOrTimeout())
		}
	}
	close(e.release)
	wg.Wait()
	for u, msg := range deliveries {
		select {
		case <-msg.Acked():
			t.Fatalf("%s: the delivery was acked by the handler", u)
		default:
		}
	}
	require.Equal(t, uint64(5), e.mw.Counters().Consumer("c").HandlerAcked)
	require.Equal(t, 5, e.effects(t))
}

func TestBatchHandlerSerializationFailureRetriesTheBatch(t *testing.T) {
	t.Parallel()
	e := newBatchEnv(t)
	var failed atomic.Bool
	h := e.mw.Middleware(once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		out, err := e.writeAll(ctx, tx, msgs)
		if err == nil && len(msgs) > 1 && failed.CompareAndSwap(false, true) {
			// The server's own serialization failure, as a conflicting writer would cause it.
			_, err = tx.ExecContext(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
		}
		return out, err
	}))
	for i, err := range e.group(t, h, keys("m", 4)...) {
		require.NoError(t, err, "delivery %d", i)
	}
	require.Equal(t, [][]string{{"busy"}, keys("m", 4), keys("m", 4)}, e.calls(), "the whole batch ran again")
	require.Equal(t, 5, e.effects(t))
	require.Equal(t, uint64(4), e.mw.Counters().Consumer("c").TxRetries)
}

func TestBatchHandlerNeedsTheMiddleware(t *testing.T) {
	t.Parallel()
	h := once.BatchHandler(func(context.Context, *sql.Tx, []*message.Message) ([]*message.Message, error) {
		return nil, nil
	})
	_, err := h(message.NewMessage("m", nil))
	require.ErrorIs(t, err, once.ErrBatchWithoutTx)
	require.True(t, wmonce.IsPermanent(err))
}

// Each message keeps its consumer span; each run of the batch function is a span of its own,
// linked to the spans of the messages it applied.
func TestBatchHandlerSpanIsLinkedToEachMessagesSpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	e := newBatchEnv(t, func(c *once.Config) { c.TracerProvider = tp })
	h := e.mw.Middleware(once.BatchHandler(e.writeAll))
	for i, err := range e.group(t, h, keys("m", 3)...) {
		require.NoError(t, err, "delivery %d", i)
	}
	consumer := map[trace.SpanID]string{}
	var batches []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "once process":
			for _, a := range s.Attributes() {
				if a.Key == "wmonce.dedupe_key" {
					consumer[s.SpanContext().SpanID()] = a.Value.AsString()
				}
			}
		case "once batch":
			batches = append(batches, s)
		}
	}
	require.Len(t, consumer, 4)
	require.Len(t, batches, 1, "busy ran alone (a batch of one, inside its own handler span); the group's three ran in one batch")
	var linked []string
	for _, l := range batches[0].Links() {
		linked = append(linked, consumer[l.SpanContext.SpanID()])
	}
	require.Equal(t, keys("m", 3), linked)
}

// A batch handler's messages are counted per message exactly as a per-message handler's are
// (Counters, the metrics package's source, the admin page's figures): the same group, with a
// copy, a message failed by name and one failed as a whole (bisected), gives the same counts.
func TestBatchHandlerCountsEachMessageAsThePerMessagePathDoes(t *testing.T) {
	t.Parallel()
	fails := func(m *message.Message) error {
		switch m.UUID {
		case "m-2":
			return errors.New("m-2 is invalid")
		case "m-5":
			return errors.New("poison")
		}
		return nil
	}
	uuids := append(keys("m", 8), "m-1", "m-6") // two copies
	run := func(t *testing.T, batch bool) once.MiddlewareCounters {
		e := newBatchEnv(t)
		var h message.HandlerFunc
		if batch {
			h = once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
				out, err := e.writeAll(ctx, tx, msgs)
				for _, m := range msgs {
					if err := fails(m); err != nil && m.UUID == "m-2" {
						return nil, &once.BatchError{Failed: map[*message.Message]error{m: err}}
					} else if err != nil {
						return nil, err // the batch as a whole: bisected
					}
				}
				return out, err
			})
		} else {
			h = func(msg *message.Message) ([]*message.Message, error) {
				tx, _ := pgtx.TxFromContext(msg.Context())
				out, err := e.writeAll(msg.Context(), tx, []*message.Message{msg})
				if ferr := fails(msg); ferr != nil {
					return nil, ferr
				}
				return out, err
			}
		}
		errs := e.group(t, e.mw.Middleware(h), uuids...)
		for i, err := range errs {
			require.Equal(t, i == 3 || i == 6, err != nil, "delivery %d: %v", i, err)
		}
		require.Equal(t, 7, e.effects(t), "busy and the six good messages, once each")
		t.Logf("batch=%v calls: %v", batch, e.calls())
		return e.mw.Counters()
	}
	perMessage, batched := run(t, false), run(t, true)
	c := batched.Consumer("c")
	require.Equal(t, once.Counters{Fresh: 7, Duplicates: 2, Failed: 2}, c, "per message: seven fresh, two copies, two failures")
	require.Equal(t, perMessage.Consumer("c"), c)
	require.Equal(t, perMessage.GroupCommitMessages, batched.GroupCommitMessages)
}
