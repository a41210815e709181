package once_test

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
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

func groupEnv(t *testing.T, cfg once.Config) *env {
	t.Helper()
	cfg.GroupCommit = once.GroupCommitConfig{Workers: 2, TxBatchSize: 50, Linger: 2 * time.Millisecond}
	e := newEnv(t, cfg)
	t.Cleanup(func() { _ = e.mw.Close() })
	return e
}

// deliverAll sends every (uuid, payload) from its own goroutine at once, as a router with many
// partitions would, and returns each delivery's outcome.
func deliverAll(h message.HandlerFunc, uuids []string) []error {
	errs := make([]error, len(uuids))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, u := range uuids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = deliver(h, u, "payload-"+u)
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

func TestGroupCommitAppliesEachOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	e := groupEnv(t, once.Config{Consumer: "c"})
	h := e.mw.Middleware(e.effect)
	var uuids []string
	for i := range 120 {
		uuids = append(uuids, fmt.Sprintf("m-%d", i%60)) // every id twice, often in one group
	}
	for _, err := range deliverAll(h, uuids) {
		require.NoError(t, err)
	}
	require.Equal(t, 60, e.effects(t))
	require.Equal(t, 60, pgtest.Count(t, e.db, `SELECT count(DISTINCT key) FROM `+e.table("effects")))
	c := e.mw.Counters().Consumer("c")
	require.Equal(t, uint64(60), c.Fresh)
	require.Equal(t, uint64(60), c.Duplicates)
	gc := e.mw.Counters()
	txs, applied := gc.GroupCommitTransactions, gc.GroupCommitMessages
	require.Equal(t, uint64(60), applied)
	require.Less(t, txs, uint64(60), "messages shared transactions")
	t.Logf("60 messages applied in %d transactions", txs)
	// Replays after the fact are absorbed too.
	for _, err := range deliverAll(h, uuids[:30]) {
		require.NoError(t, err)
	}
	require.Equal(t, 60, e.effects(t))
}

func TestGroupCommitIsolatesAFailingMessage(t *testing.T) {
	t.Parallel()
	e := groupEnv(t, once.Config{Consumer: "c", OutputTopic: "out"})
	signals := once.GroupCommitTestSignals(e.mw)
	var poisonRuns atomic.Int32
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if _, err := e.effect(msg); err != nil {
			return nil, err
		}
		switch msg.UUID {
		case "bad-error":
			poisonRuns.Add(1)
			return nil, errors.New("handler failed")
		case "bad-sql":
			// Leaves the transaction aborted: every later statement of the group fails too.
			tx, _ := pgtx.TxFromContext(msg.Context())
			_, err := tx.ExecContext(msg.Context(), `SELECT 1/0`)
			return nil, err
		case "bad-panic":
			panic("boom")
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte(`{}`))}, nil
	})
	uuids := []string{"bad-error", "bad-sql", "bad-panic"}
	for i := range 40 {
		uuids = append(uuids, fmt.Sprintf("ok-%d", i))
	}
	errs := deliverAll(h, uuids)
	for i, u := range uuids {
		if u[:3] == "bad" {
			require.Error(t, errs[i], u)
		} else {
			require.NoError(t, errs[i], u)
		}
	}
	require.True(t, wmonce.IsPanic(errs[2]))
	isolated := []string{signals.Isolated.WaitOrTimeout(), signals.Isolated.WaitOrTimeout(), signals.Isolated.WaitOrTimeout()}
	require.ElementsMatch(t, []string{"bad-error", "bad-sql", "bad-panic"}, isolated, "each failure was isolated from its group")
	require.Empty(t, signals.Isolated.C(), "and nothing else was")
	require.Equal(t, 40, e.effects(t), "only the good messages' writes committed")
	require.Equal(t, 40, e.claims(t), "failed messages left no claim")
	require.Equal(t, 40, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE key LIKE 'bad%'`))

	// Redelivered alone later, a fixed message applies once.
	require.NoError(t, deliver(e.mw.Middleware(e.effect), "bad-error", "p"))
	require.Equal(t, 41, e.effects(t))
}

func TestGroupCommitWithPartitionsAndAgeGuard(t *testing.T) {
	t.Parallel()
	now := time.Now()
	e := groupEnv(t, once.Config{Consumer: "c", PartitionByDay: true, MaxMessageAge: 24 * time.Hour})
	h := e.mw.Middleware(e.effect)
	msgs := []*message.Message{
		occurred("fresh-1", now.Add(-time.Hour), "p"),
		occurred("fresh-2", now.Add(-2*time.Hour), "p"),
		occurred("old", now.Add(-72*time.Hour), "p"),
		occurred("fresh-1", now.Add(-time.Hour), "p"),
	}
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = h(m) }()
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.ErrorIs(t, errs[2], wmonce.ErrTooOld)
	require.NoError(t, errs[3])
	require.Equal(t, 2, e.effects(t))
	require.Equal(t, 2, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("processed_messages_daily")))
}

func TestGroupCommitConfigValidation(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	_, err := once.New(db, once.Config{GroupCommit: once.GroupCommitConfig{TxBatchSize: -1}}, nil)
	require.ErrorContains(t, err, "TxBatchSize")
	mw, err := once.New(db, once.Config{GroupCommit: once.GroupCommitConfig{}}, nil)
	require.NoError(t, err)
	require.NoError(t, mw.Close())
	require.NoError(t, mw.Close(), "Close is idempotent")
}

// The default, adaptive mode (Linger 0): messages that find the lane free run alone, the rest
// are grouped; either way each id applies once and copies are counted as duplicates.
func TestGroupCommitAdaptiveAppliesEachOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c", GroupCommit: once.GroupCommitConfig{Workers: 1}})
	t.Cleanup(func() { _ = e.mw.Close() })
	h := e.mw.Middleware(e.effect)
	var uuids []string
	for i := range 120 {
		uuids = append(uuids, fmt.Sprintf("m-%d", i%60))
	}
	for _, err := range deliverAll(h, uuids) {
		require.NoError(t, err)
	}
	require.Equal(t, 60, e.effects(t))
	require.Equal(t, 60, pgtest.Count(t, e.db, `SELECT count(DISTINCT key) FROM `+e.table("effects")))
	c := e.mw.Counters().Consumer("c")
	require.Equal(t, uint64(60), c.Fresh)
	require.Equal(t, uint64(60), c.Duplicates)
	gc := e.mw.Counters()
	txs, grouped := gc.GroupCommitTransactions, gc.GroupCommitMessages
	t.Logf("%d of 60 applied in %d group transactions, the rest alone", grouped, txs)
}

// A message waiting for a lane gives up when its deadline passes, without running.
func TestGroupCommitWaitingMessageHonoursItsDeadline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c", GroupCommit: once.GroupCommitConfig{Workers: 1}})
	t.Cleanup(func() { _ = e.mw.Close() })
	entered, release := make(chan struct{}), make(chan struct{})
	var ran atomic.Int32
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ran.Add(1)
		if msg.UUID == "slow" {
			close(entered)
			<-release
		}
		return e.effect(msg)
	})
	slow := make(chan error, 1)
	go func() { slow <- deliver(h, "slow", "p") }()
	<-entered // the only lane is busy
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	waiting := message.NewMessage("waiting", []byte("p"))
	waiting.SetContext(ctx)
	gaveUp := make(chan error, 1)
	go func() { _, err := h(waiting); gaveUp <- err }()
	select {
	case err := <-gaveUp:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the waiting message did not give up at its deadline")
	}
	close(release)
	require.NoError(t, <-slow)
	require.Equal(t, int32(1), ran.Load(), "the message that gave up never ran")
	require.Equal(t, 1, e.effects(t))
}

// With a zero GroupCommitConfig, messages that find both default lanes busy wait and then share
// one transaction; with Disabled, every message runs at once in a transaction of its own.
func TestGroupCommitIsTheDefault(t *testing.T) {
	t.Parallel()
	for name, gc := range map[string]once.GroupCommitConfig{"default": {}, "disabled": {Disabled: true}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, once.Config{Consumer: "c", GroupCommit: gc})
			const busy, waiting = 2, 3 // GroupCommitConfig.Workers defaults to 2
			entered, release := make(chan string, busy+waiting), make(chan struct{})
			h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				entered <- msg.UUID
				if strings.HasPrefix(msg.UUID, "busy") {
					<-release
				}
				return e.effect(msg)
			})
			var wg sync.WaitGroup
			errs := make(chan error, busy+waiting)
			send := func(uuid string) { wg.Go(func() { errs <- deliver(h, uuid, "p") }) }
			for i := range busy {
				send(fmt.Sprintf("busy-%d", i))
			}
			for range busy {
				<-entered // every lane is held by a blocked handler
			}
			if gc.Disabled {
				for i := range waiting {
					send(fmt.Sprintf("m-%d", i))
					<-entered // runs at once, beside the blocked ones
				}
			} else {
				signals := once.GroupCommitTestSignals(e.mw)
				for i := range waiting {
					send(fmt.Sprintf("m-%d", i))
					require.Equal(t, i+1, signals.Queued.WaitOrTimeout(), "m-%d waits for a lane", i)
				}
			}
			close(release)
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.Equal(t, busy+waiting, e.effects(t))
			c := e.mw.Counters()
			if gc.Disabled {
				require.Zero(t, c.GroupCommitTransactions, "no group without group commit")
				return
			}
			require.Equal(t, uint64(waiting), c.GroupCommitMessages, "the waiting messages ran grouped")
			require.Equal(t, uint64(1), c.GroupCommitTransactions, "in one transaction")
		})
	}
}

// TestGroupCommitRetryOutlivesAMemberAnsweredEarly: a group holds a copy of an applied message
// (answered at once as a duplicate, so its caller returns) and a message whose handler meets a
// serialization failure. The group's retry must not end with the duplicate's context: it runs
// again and applies the message (issue 34, item 10: "context canceled" after one run,
// TxRetries 0).
func TestGroupCommitRetryOutlivesAMemberAnsweredEarly(t *testing.T) {
	t.Parallel()
	cfg := once.Config{Consumer: "c"}
	cfg.GroupCommit = once.GroupCommitConfig{Workers: 1, TxBatchSize: 50}
	e := newEnv(t, cfg)
	signals := once.GroupCommitTestSignals(e.mw)
	release, busy, dupReturned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		switch msg.UUID {
		case "busy":
			close(busy)
			<-release
		case "m-1":
			if runs.Add(1) == 1 {
				<-dupReturned // the duplicate's caller has returned, its context ended
				tx, _ := pgtx.TxFromContext(msg.Context())
				_, err := tx.ExecContext(msg.Context(), `DO $$BEGIN RAISE EXCEPTION 'lost a race' USING ERRCODE = 'serialization_failure'; END$$`)
				return nil, err
			}
		}
		return e.effect(msg)
	})
	require.NoError(t, deliver(h, "dup", "p"))

	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, deliver(h, "busy", "p")) })
	<-busy // it holds the only lane
	wg.Go(func() {
		require.NoError(t, deliver(h, "dup", "p"), "a copy of an applied message")
		close(dupReturned)
	})
	require.Equal(t, 1, signals.Queued.WaitOrTimeout())
	var m1 error
	wg.Go(func() { m1 = deliver(h, "m-1", "p") })
	require.Equal(t, 2, signals.Queued.WaitOrTimeout())
	close(release)
	wg.Wait()

	require.NoError(t, m1, "the group ran again after the serialization failure")
	require.Equal(t, int32(2), runs.Load())
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE key = 'm-1'`))
	c := e.mw.Counters().Consumer("c")
	require.Positive(t, c.TxRetries)
	require.Equal(t, uint64(1), c.Duplicates)
}
