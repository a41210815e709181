package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
)

// A handler that fails three times is retried with growing, jittered delays; the failed
// attempts leave nothing behind and the fourth applies the message once.
func testFailingHandlerRetriesWithBackoffThenSucceeds(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	var mu sync.Mutex
	var starts []time.Time
	var attempts []int
	cfg := fast("c")
	cfg.Backoff, cfg.MaxBackoff, cfg.MaxAttempts = 40*time.Millisecond, time.Second, 5
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		d, _ := inbox.DeliveryFromContext(m.Context())
		mu.Lock()
		starts = append(starts, time.Now())
		attempts = append(attempts, d.Attempt)
		mu.Unlock()
		if err := e.effect(m, "w"); err != nil { // written, then rolled back on failure
			return nil, err
		}
		if d.Attempt <= 3 {
			return nil, fmt.Errorf("boom %d", d.Attempt)
		}
		return nil, nil
	}, cfg)
	require.NoError(t, r.Handle(msg("e-1", "x")))
	p.until(t, "success", func(n tally) bool { return n.Done == 1 })

	require.Equal(t, 1, e.effects(t))
	row, err := e.ops.InspectMessage(context.Background(), "c", "e-1")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusDone, row.Status)
	require.Equal(t, 4, row.Attempts)
	require.Equal(t, "boom 3", row.LastError, "the last failure is kept for the record")
	require.Equal(t, uint64(3), p.Counters().Failed)
	require.Zero(t, p.Counters().Parked)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 2, 3, 4}, attempts)
	for i := 1; i < len(starts); i++ {
		// Delay after attempt i is drawn from [d/2, d] with d = 40ms * 2^(i-1).
		minDelay := (40 * time.Millisecond << (i - 1)) / 2
		require.GreaterOrEqual(t, starts[i].Sub(starts[i-1]), minDelay, "delay after attempt %d", i)
	}
}

// A row that keeps failing is parked as FAILED after MaxAttempts and holds back only the later
// rows of its own key; other keys and unordered rows go on. Unparking runs the key in order.
func testPoisonRowParkedWhileOtherKeysGoOn(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c", OrderingKey: orderByMetadataKey})
	var healed atomic.Bool
	cfg := fast("c")
	cfg.MaxAttempts = 3
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if string(m.Payload) == "poison" && !healed.Load() {
			return nil, errors.New("cannot decode")
		}
		if string(m.Payload) == "permanent" && !healed.Load() {
			return nil, wmonce.Permanent(errors.New("schema violation"))
		}
		return nil, e.effect(m, "w")
	}, cfg)

	for _, m := range []*message.Message{
		msg("a1", "poison", "key", "A", "seq", "1"),
		msg("a2", "ok", "key", "A", "seq", "2"),
		msg("b1", "ok", "key", "B", "seq", "1"),
		msg("p1", "permanent", "key", "P", "seq", "1"),
		msg("p2", "ok", "key", "P", "seq", "2"),
		msg("b2", "ok", "key", "B", "seq", "2"),
		msg("u1", "ok"), // unordered
		msg("b3", "ok", "key", "B", "seq", "3"),
	} {
		require.NoError(t, r.Handle(m))
	}
	p.until(t, "the poison rows to be parked and the rest processed", func(n tally) bool { return n.Parked == 2 && n.Done == 4 })
	ctx := context.Background()
	for id, want := range map[string]struct {
		status   inbox.Status
		attempts int
	}{
		"a1": {inbox.StatusFailed, 3}, "a2": {inbox.StatusPending, 0},
		"p1": {inbox.StatusFailed, 1}, "p2": {inbox.StatusPending, 0},
		"b1": {inbox.StatusDone, 1}, "b2": {inbox.StatusDone, 1}, "b3": {inbox.StatusDone, 1}, "u1": {inbox.StatusDone, 1},
	} {
		row, err := e.ops.InspectMessage(ctx, "c", id)
		require.NoError(t, err)
		require.Equal(t, want.status, row.Status, id)
		require.Equal(t, want.attempts, row.Attempts, id)
	}
	row, err := e.ops.InspectMessage(ctx, "c", "p1")
	require.NoError(t, err)
	require.Contains(t, row.LastError, "schema violation", "a permanent error parks at once")
	st, err := e.ops.Stats(ctx, "c")
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Failed)
	require.Equal(t, int64(2), st.Pending)
	require.Positive(t, st.OldestPendingAge)

	// Unparking A runs a1, then a2; P stays parked until it is dealt with.
	healed.Store(true)
	n, err := e.ops.UnparkKey(ctx, "c", "A")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	p.until(t, "key A to finish", func(n tally) bool { return n.Done == 6 })
	require.Equal(t, 2, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE okey = 'A'`))
	require.Equal(t, []int{1, 2}, seqsOf(t, e, "A"))
	require.Equal(t, 1, e.status(t, "c", inbox.StatusFailed))
}

func seqsOf(t *testing.T, e *env, key string) []int {
	rs, err := e.db.Query(`SELECT seq FROM `+e.table("effects")+` WHERE okey = $1 ORDER BY id`, key)
	require.NoError(t, err)
	defer rs.Close()
	var out []int
	for rs.Next() {
		var s int
		require.NoError(t, rs.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rs.Err())
	return out
}

// With four workers, each key's rows are applied strictly in received order, even when rows
// fail and are retried, while different keys run in parallel.
func testPerKeyOrderWithFourWorkers(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c", OrderingKey: orderByMetadataKey})
	var inFlight, maxInFlight atomic.Int32
	cfg := fast("c")
	cfg.Workers, cfg.BatchSize = 4, 4
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			old := maxInFlight.Load()
			if n <= old || maxInFlight.CompareAndSwap(old, n) {
				break
			}
		}
		time.Sleep(time.Millisecond)
		d, _ := inbox.DeliveryFromContext(m.Context())
		if err := e.effect(m, "w"); err != nil {
			return nil, err
		}
		if m.Metadata.Get("flaky") == "yes" && d.Attempt == 1 {
			return nil, errors.New("transient")
		}
		return nil, nil
	}, cfg)

	const keys, perKey = 8, 25
	var wg sync.WaitGroup
	for k := range keys {
		// Each key arrives sequentially, like one partition; keys arrive concurrently.
		wg.Go(func() {
			for s := range perKey {
				flaky := "no"
				if (s+k)%7 == 0 {
					flaky = "yes"
				}
				require.NoError(t, r.Handle(msg(fmt.Sprintf("k%d-%d", k, s), "x", "key", fmt.Sprintf("K%d", k), "seq", fmt.Sprint(s), "flaky", flaky)))
			}
		})
	}
	wg.Wait()
	p.until(t, "all rows", func(n tally) bool { return n.Done == keys*perKey })
	for k := range keys {
		want := make([]int, perKey)
		for s := range want {
			want[s] = s
		}
		require.Equal(t, want, seqsOf(t, e, fmt.Sprintf("K%d", k)), "key K%d", k)
	}
	require.Positive(t, p.Counters().Failed)
	require.GreaterOrEqual(t, maxInFlight.Load(), int32(2), "keys were processed in parallel")
}

// Parked rows replayed after a fix run once more, and only once; a dry run changes nothing.
func testReplayedRowsProcessedOnceMore(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	var fixed atomic.Bool
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if m.Metadata.Get("bad") == "yes" && !fixed.Load() {
			return nil, wmonce.Permanent(errors.New("unknown currency"))
		}
		return nil, e.effect(m, "w")
	}, fast("c"))
	for i := range 10 {
		bad := "no"
		if i%2 == 0 {
			bad = "yes"
		}
		require.NoError(t, r.Handle(msg(fmt.Sprintf("e-%d", i), "x", "bad", bad)))
	}
	p.until(t, "five parked, five done", func(n tally) bool { return n.Parked == 5 && n.Done == 5 })

	ctx := context.Background()
	failed := inbox.Filter{Consumer: "c"}
	n, err := e.ops.Replay(ctx, failed, true)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Equal(t, 5, e.status(t, "c", inbox.StatusFailed), "a dry run changes nothing")

	fixed.Store(true)
	n, err = e.ops.Replay(ctx, failed, false)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	p.until(t, "the replayed rows", func(n tally) bool { return n.Done == 10 })
	n, err = e.ops.Replay(ctx, failed, false)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to replay")
	require.Equal(t, 10, e.effects(t))
	require.Equal(t, 10, pgtest.Count(t, e.db, `SELECT count(DISTINCT message_id) FROM `+e.table("effects")))

	// A DONE row can be replayed on purpose: it runs exactly once more.
	n, err = e.ops.Replay(ctx, inbox.Filter{Consumer: "c", Statuses: []inbox.Status{inbox.StatusDone}, MessageIDs: []string{"e-3"}}, false)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	p.until(t, "the replayed DONE row", func(n tally) bool { return n.Done == 11 })
	require.Equal(t, 10, e.status(t, "c", inbox.StatusDone))
	require.Equal(t, 2, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE message_id = 'e-3'`))
	require.Equal(t, 11, e.effects(t))
}

// With an hour-long poll interval, rows are still picked up at once: LISTEN/NOTIFY wakes idle
// workers.
func testNotifyWakesIdleWorkers(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	cfg := fast("c")
	cfg.Workers, cfg.PollInterval, cfg.ReapInterval = 1, time.Hour, time.Hour
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "w") }, cfg)
	// At most one wake-up is left over from startup (the worker's wake buffer holds one), so
	// three rows in a row can only all be picked up through notifications.
	for i := range 3 {
		require.NoError(t, r.Handle(msg(fmt.Sprintf("e-%d", i), "x")))
		p.until(t, "the row to be processed without polling", func(n tally) bool { return n.Done == i+1 })
	}
}

// A handler still running when the grace period ends is cancelled and its row released; one
// that ignores the cancellation is abandoned, its row released anyway, and whatever it does
// later cannot complete the row.
func testShutdownCancelsHandlersPastGrace(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	require.NoError(t, r.Handle(msg("polite", "x")))
	require.NoError(t, r.Handle(msg("stubborn", "x")))
	entered := make(chan struct{}, 2)
	ignore := make(chan struct{})
	returned := make(chan struct{})
	cfg := fast("c")
	cfg.Workers, cfg.BatchSize, cfg.ShutdownGrace = 2, 1, 100*time.Millisecond
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if err := e.effect(m, "first"); err != nil {
			return nil, err
		}
		entered <- struct{}{}
		if m.UUID == "stubborn" {
			defer close(returned)
			<-ignore
			return nil, nil
		}
		<-m.Context().Done()
		return nil, m.Context().Err()
	}, cfg)
	<-entered
	<-entered
	require.NoError(t, p.Close())
	require.Equal(t, 2, e.status(t, "c", inbox.StatusPending))
	require.Equal(t, 2, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")+` WHERE attempts = 0`), "shutdown is not the message's fault")
	require.Zero(t, p.Counters().Failed)

	close(ignore)
	<-returned
	next := e.start(t, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "next") }, fast("c"))
	next.until(t, "the next processor to apply both rows", func(n tally) bool { return n.Done == 2 })
	require.Equal(t, 2, e.effects(t))
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE worker = 'first'`))
	require.Zero(t, p.Counters().Processed)
}

// Messages the handler returns are stored in the outbox in the handler's transaction, with the
// inbox message as their cause; a failed attempt leaves none.
func testOutputsGoToOutboxInTheSameTransaction(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	cfg := fast("c")
	cfg.OutputTopic = "cashback"
	w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	pub := w.Publisher()
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		sms := message.NewMessage("sms-"+m.UUID, []byte("hi"))
		sms.SetContext(m.Context())
		if err := pub.Publish("sms", sms); err != nil {
			return nil, err
		}
		out := []*message.Message{message.NewMessage("cb-"+m.UUID, []byte(`{"paise":2400}`))}
		if d, _ := inbox.DeliveryFromContext(m.Context()); d.Attempt == 1 {
			return out, errors.New("fails after producing")
		}
		return out, nil
	}, cfg)
	in := msg("pay-1", "x")
	in.Metadata.Set("correlation_id", "corr-9")
	require.NoError(t, r.Handle(in))
	p.until(t, "processing", func(n tally) bool { return n.Done == 1 })
	require.Equal(t, uint64(1), p.Counters().Failed)

	rs, err := e.db.Query(`SELECT uuid, payload->>'destination_topic', metadata->>'causation_id', metadata->>'correlation_id' FROM ` + e.table("outbox") + ` ORDER BY "offset"`)
	require.NoError(t, err)
	defer rs.Close()
	var got []string
	for rs.Next() {
		var uuid, topic, cause, corr string
		require.NoError(t, rs.Scan(&uuid, &topic, &cause, &corr))
		got = append(got, strings.Join([]string{uuid, topic, cause, corr}, " "))
	}
	require.NoError(t, rs.Err())
	require.Equal(t, []string{"sms-pay-1 sms pay-1 corr-9", "cb-pay-1 cashback pay-1 corr-9"}, got)
}

// Returning messages without an OutputTopic is a permanent error: the row is parked.
func testOutputsWithoutTopicPark(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("o", nil)}, e.effect(m, "w")
	}, fast("c"))
	require.NoError(t, r.Handle(msg("e-1", "x")))
	p.until(t, "parking", func(n tally) bool { return n.Parked == 1 })
	row, err := e.ops.InspectMessage(context.Background(), "c", "e-1")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusFailed, row.Status)
	require.Contains(t, row.LastError, "OutputTopic is empty")
	require.Zero(t, e.effects(t))
}

// In batch mode many rows share one transaction; a failing row sends its batch back to one
// transaction per row, and every row is still applied exactly once.
func testTxBatchModeAppliesEachRowOnce(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	ctx := context.Background()
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	var msgs []*message.Message
	for i := range 200 {
		msgs = append(msgs, msg(fmt.Sprintf("e-%d", i), "x", "seq", fmt.Sprint(i)))
	}
	_, err = r.StoreTx(ctx, tx, "t", msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	cfg := fast("c")
	cfg.BatchSize, cfg.TxBatchSize = 50, 25
	var runs atomic.Int32
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		if err := e.effect(m, "w"); err != nil {
			return nil, err
		}
		if d, _ := inbox.DeliveryFromContext(m.Context()); m.Metadata.Get("seq") == "77" && d.Attempt == 1 {
			return nil, errors.New("once")
		}
		return nil, nil
	}, cfg)
	p.until(t, "all rows", func(n tally) bool { return n.Done == 200 })
	require.Equal(t, 200, e.effects(t))
	require.Equal(t, 200, pgtest.Count(t, e.db, `SELECT count(DISTINCT message_id) FROM `+e.table("effects")))
	require.Equal(t, uint64(1), p.Counters().Failed)
	require.Greater(t, runs.Load(), int32(200), "the failing batch ran again row by row")
}

// A handler panic is a failed attempt like an error: rolled back, recorded, retried.
func testPanicIsAFailedAttempt(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if err := e.effect(m, "w"); err != nil {
			return nil, err
		}
		if d, _ := inbox.DeliveryFromContext(m.Context()); d.Attempt == 1 {
			panic("nil map")
		}
		return nil, nil
	}, fast("c"))
	require.NoError(t, r.Handle(msg("e-1", "x")))
	p.until(t, "processing", func(n tally) bool { return n.Done == 1 })
	require.Equal(t, 1, e.effects(t))
	row, err := e.ops.InspectMessage(context.Background(), "c", "e-1")
	require.NoError(t, err)
	require.Contains(t, row.LastError, "handler panicked: nil map")
}

func testRunOnceAndCloseBeforeRun(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	p, err := inbox.NewProcessor(e.db, func(*message.Message) ([]*message.Message, error) { return nil, nil }, fast("c"), nil)
	require.NoError(t, err)
	require.NoError(t, p.Close())
	require.NoError(t, p.Run(context.Background()), "Run after Close returns at once")
}
