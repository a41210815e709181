package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// locking is the test configuration in ClaimLock mode.
func locking(consumer string, workers, txBatch int) inbox.ProcessorConfig {
	cfg := fast(consumer)
	cfg.ClaimMode, cfg.Workers, cfg.TxBatchSize = inbox.ClaimLock, workers, txBatch
	return cfg
}

func storeAll(t *testing.T, e *env, r *inbox.Receiver, msgs []*message.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = r.StoreTx(ctx, tx, "t", msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
}

// ClaimLock batches: every row applied once, a failing row isolates itself (its batch is
// rerun row by row), rows are never marked IN_PROGRESS, and each attempt is counted once.
func TestClaimLockAppliesEachRowOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	var msgs []*message.Message
	for i := range 300 {
		msgs = append(msgs, msg(fmt.Sprintf("e-%d", i), "x", "seq", fmt.Sprint(i)))
	}
	storeAll(t, e, r, msgs)

	var runs atomic.Int32
	var sawInProgress atomic.Bool
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		if e.status(t, "c", inbox.StatusInProgress) > 0 {
			sawInProgress.Store(true)
		}
		if err := e.effect(m, "w"); err != nil {
			return nil, err
		}
		if d, _ := inbox.DeliveryFromContext(m.Context()); m.Metadata.Get("seq") == "77" && d.Attempt == 1 {
			return nil, errors.New("once")
		}
		return nil, nil
	}, locking("c", 3, 25))
	p.until(t, "all rows", func(n tally) bool { return n.Done == 300 })
	require.Equal(t, 300, e.effects(t))
	require.Equal(t, 300, pgtest.Count(t, e.db, `SELECT count(DISTINCT message_id) FROM `+e.table("effects")))
	require.Equal(t, 300, e.status(t, "c", inbox.StatusDone))
	require.Equal(t, uint64(1), p.Counters().Failed)
	require.Zero(t, p.Counters().LeaseConflicts)
	require.False(t, sawInProgress.Load(), "ClaimLock never marks rows IN_PROGRESS")
	require.Greater(t, runs.Load(), int32(300), "the failing batch ran again row by row")
	row, err := e.ops.InspectMessage(context.Background(), "c", "e-77")
	require.NoError(t, err)
	require.Equal(t, 2, row.Attempts)
	require.Equal(t, "once", row.LastError)
	require.Equal(t, 299, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")+` WHERE attempts = 1 AND claim_token IS NULL`))
}

// ClaimLock keeps per-key order with several workers, retries with backoff, and parks a row
// that keeps failing after MaxAttempts: it holds back its own key only.
func TestClaimLockKeepsKeyOrderAndParks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c", OrderingKey: orderByMetadataKey})
	cfg := locking("c", 4, 4)
	cfg.MaxAttempts = 3
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		time.Sleep(time.Millisecond)
		d, _ := inbox.DeliveryFromContext(m.Context())
		if err := e.effect(m, "w"); err != nil {
			return nil, err
		}
		if m.Metadata.Get("poison") == "yes" {
			return nil, fmt.Errorf("poison, attempt %d", d.Attempt)
		}
		if m.Metadata.Get("flaky") == "yes" && d.Attempt == 1 {
			return nil, errors.New("transient")
		}
		return nil, nil
	}, cfg)

	const keys, perKey = 6, 20
	var wg sync.WaitGroup
	for k := range keys {
		wg.Go(func() {
			for s := range perKey {
				kv := []string{"key", fmt.Sprintf("K%d", k), "seq", fmt.Sprint(s)}
				if (s+k)%5 == 0 {
					kv = append(kv, "flaky", "yes")
				}
				if k == 0 && s == 10 {
					kv = append(kv, "poison", "yes")
				}
				require.NoError(t, r.Handle(msg(fmt.Sprintf("k%d-%d", k, s), "x", kv...)))
			}
		})
	}
	wg.Wait()
	p.until(t, "all but the parked key's tail", func(n tally) bool { return n.Done == keys*perKey-(perKey-10) && n.Parked == 1 })
	want := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	for k := 1; k < keys; k++ {
		require.Equal(t, want(perKey), seqsOf(t, e, fmt.Sprintf("K%d", k)), "key K%d", k)
	}
	require.Equal(t, want(10), seqsOf(t, e, "K0"), "K0 stops before its poison row")
	row, err := e.ops.InspectMessage(context.Background(), "c", "k0-10")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusFailed, row.Status)
	require.Equal(t, 3, row.Attempts)
	require.Equal(t, "poison, attempt 3", row.LastError)
	require.Equal(t, perKey-11, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")+` WHERE ordering_key = 'K0' AND status = 'PENDING'`))
}

// A handler that outlives HandlerTimeout (ignoring its context) loses its transaction: the
// lock goes with it, another worker applies the row, and nothing the stalled handler wrote
// commits. Its late outcome changes nothing.
func TestClaimLockCutsOffHandlersPastTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	cfg := locking("c", 2, 1)
	cfg.HandlerTimeout = 300 * time.Millisecond
	var calls atomic.Int32
	release := make(chan struct{})
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			if err := e.effect(m, "stalled"); err != nil {
				return nil, err
			}
			<-release // ignores the context on purpose
			return nil, nil
		}
		return nil, e.effect(m, "second")
	}, cfg)
	require.NoError(t, r.Handle(msg("e-1", "x")))
	p.until(t, "another worker to apply the row", func(n tally) bool { return n.Done == 1 })
	close(release)
	p.until(t, "the stalled attempt to be settled", func(n tally) bool { return n.Failed == 1 })
	require.Equal(t, uint64(1), p.Counters().Processed)
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE worker = 'second'`))
	row, err := e.ops.InspectMessage(context.Background(), "c", "e-1")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusDone, row.Status)
}

// Close lets a running handler finish within the grace period; one that does not is cancelled
// and rolled back, and its row is simply PENDING again with the attempt not counted.
func TestClaimLockShutdownGivesRowsBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	require.NoError(t, r.Handle(msg("e-1", "x")))
	cfg := locking("c", 1, 1)
	cfg.ShutdownGrace = 100 * time.Millisecond
	entered := make(chan struct{})
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if err := e.effect(m, "w"); err != nil {
			return nil, err
		}
		close(entered)
		<-m.Context().Done()
		return nil, m.Context().Err()
	}, cfg)
	<-entered
	require.NoError(t, p.Close())
	require.Zero(t, p.Counters().Processed)
	require.Zero(t, p.Counters().Failed)
	require.Equal(t, uint64(1), p.Counters().Released)
	require.Zero(t, e.effects(t))
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")+` WHERE status = 'PENDING' AND attempts = 0`))

	next := e.start(t, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "next") }, locking("c", 1, 1))
	next.until(t, "the row to be applied after the restart", func(n tally) bool { return n.Done == 1 })
	require.Equal(t, 1, e.effects(t))
}

// A lease-mode and a lock-mode processor can work one consumer at once: each skips what the
// other holds, and every row is applied once.
func TestClaimLockAndLeaseShareAConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	var msgs []*message.Message
	for i := range 400 {
		msgs = append(msgs, msg(fmt.Sprintf("e-%d", i), "x"))
	}
	storeAll(t, e, r, msgs)
	lease := fast("c")
	lease.Workers, lease.BatchSize, lease.TxBatchSize = 2, 20, 10
	a := e.start(t, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "lease") }, lease)
	b := e.start(t, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "lock") }, locking("c", 2, 10))
	untilSettled(t, "all rows", func() bool { return a.settled.Done+b.settled.Done == 400 }, a, b)
	require.Equal(t, 400, e.effects(t))
	require.Equal(t, 400, pgtest.Count(t, e.db, `SELECT count(DISTINCT message_id) FROM `+e.table("effects")))
	require.Equal(t, 400, e.status(t, "c", inbox.StatusDone))
}

func TestClaimModeValidation(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	_, err := inbox.NewProcessor(db, h, inbox.ProcessorConfig{Consumer: "c", ClaimMode: inbox.ClaimMode(7)}, nil)
	require.ErrorContains(t, err, "ClaimMode")
	// ClaimLock locks TxBatchSize rows per transaction, so BatchSize does not bound it.
	_, err = inbox.NewProcessor(db, h, inbox.ProcessorConfig{Consumer: "c", ClaimMode: inbox.ClaimLock, TxBatchSize: 100}, nil)
	require.NoError(t, err)
	_, err = inbox.NewProcessor(db, h, inbox.ProcessorConfig{Consumer: "c", TxBatchSize: 100}, nil)
	require.ErrorContains(t, err, "TxBatchSize")
	require.Equal(t, "lock", inbox.ClaimLock.String())
}

// An attempt whose start the database records only after the worker gave up on it (the start
// outlived HandlerTimeout, as on a loaded machine) never ran its handler: it must not count.
// Before, the late start was taken for an attempt that had killed its process, so the row was
// counted an attempt it never had and, at MaxAttempts, parked without running.
func TestClaimLockStartRecordedLateDoesNotCount(t *testing.T) {
	t.Parallel()
	for _, txBatch := range []int{1, 2} {
		t.Run(fmt.Sprintf("txbatch=%d", txBatch), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
			ids := []string{"m1", "m2"}[:txBatch]
			storeAll(t, e, r, []*message.Message{msg("m1", "x"), msg("m2", "x")}[:txBatch])
			// The first start waits for the row lock its own worker holds: it can go on only
			// once the worker's transaction ended at HandlerTimeout, and it then commits.
			pgtest.Exec(t, e.db, `CREATE TABLE `+e.table("slow_start")+` (x int); INSERT INTO `+e.table("slow_start")+` VALUES (1)`)
			pgtest.Exec(t, e.db, `CREATE FUNCTION `+e.table("slow_start")+`() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n int;
BEGIN
    DELETE FROM `+e.table("slow_start")+`;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM 1 FROM `+e.table("inbox")+` WHERE id = NEW.inbox_id FOR UPDATE;
    END IF;
    RETURN NEW;
END $$`)
			pgtest.Exec(t, e.db, `CREATE TRIGGER slow_start BEFORE INSERT ON `+e.table("inbox_attempts")+
				` FOR EACH ROW EXECUTE FUNCTION `+e.table("slow_start")+`()`)

			var mu sync.Mutex
			runs := map[string]int{}
			cfg := locking("c", 1, txBatch)
			cfg.HandlerTimeout, cfg.MaxAttempts = time.Second, 2
			p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
				mu.Lock()
				runs[m.UUID]++
				mu.Unlock()
				return nil, e.effect(m, "w")
			}, cfg)
			p.until(t, "every row finished", func(n tally) bool { return n.Done+n.Parked == len(ids) })
			require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("slow_start")), "the slow start happened")
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				row, err := e.ops.InspectMessage(context.Background(), "c", id)
				require.NoError(t, err)
				require.Equal(t, inbox.StatusDone, row.Status, "%s: %s", id, row.LastError)
				require.LessOrEqual(t, row.Attempts, runs[id], "%s: an attempt counted without its handler running", id)
			}
			require.Equal(t, len(ids), e.effects(t))
		})
	}
}

// In ClaimLock mode the failure is recorded in the locking transaction, which began before the
// handler ran: the retry must still wait Backoff after the failure, not after the claim. A
// handler slower than Backoff shows the difference: measured from the claim, the row would be
// due again at once.
func TestClaimLockRetryWaitsBackoffAfterTheFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	cfg := locking("c", 1, 1)
	cfg.Backoff, cfg.MaxBackoff, cfg.MaxAttempts = 200*time.Millisecond, 200*time.Millisecond, 3
	var mu sync.Mutex
	var failedAt, retriedAt time.Time
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		d, _ := inbox.DeliveryFromContext(m.Context())
		if d.Attempt == 1 {
			time.Sleep(300 * time.Millisecond) // the handler's own work, longer than Backoff
			mu.Lock()
			failedAt = time.Now()
			mu.Unlock()
			return nil, errors.New("boom")
		}
		mu.Lock()
		retriedAt = time.Now()
		mu.Unlock()
		return nil, e.effect(m, "w")
	}, cfg)
	require.NoError(t, r.Handle(msg("e-1", "x")))
	p.until(t, "the retry to succeed", func(n tally) bool { return n.Done == 1 })
	mu.Lock()
	defer mu.Unlock()
	// Backoff is drawn from [d/2, d]: at least 100ms after the failure.
	require.GreaterOrEqual(t, retriedAt.Sub(failedAt), 100*time.Millisecond)
}

// A start another worker withdrew (its attempt did not happen) after this worker's claim
// statement had read it, and before this worker locked the row, does not count: the claim's
// snapshot still shows it, and with MaxAttempts 1 the row was parked without ever running.
func TestClaimLockIgnoresAStartWithdrawnAfterTheClaimRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	storeAll(t, e, r, []*message.Message{msg("m1", "x")})
	// The start of attempt 1, as the other worker commits it before it runs the row.
	pgtest.Exec(t, e.db, `INSERT INTO `+e.table("inbox_attempts")+` (inbox_id, attempt, row_xmin)
SELECT id, 1, xmin FROM `+e.table("inbox")+` WHERE message_id = 'm1'`)
	var runs atomic.Int32
	cfg := locking("c", 1, 1)
	cfg.MaxAttempts = 1
	p := e.processor(t, func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return nil, e.effect(m, "w")
	}, cfg)
	sig := p.TestSignals()
	sig.Settled.Init()
	withdrawn := make(chan error, 1)
	p.TestHooks().Locked = func([]int64) {
		_, err := e.db.Exec(`DELETE FROM ` + e.table("inbox_attempts"))
		select {
		case withdrawn <- err:
		default:
		}
	}
	e.run(t, p)
	pr := &proc{Processor: p, sig: sig}
	pr.until(t, "the row settled", func(n tally) bool { return n.Done+n.Parked+n.Failed > 0 })
	require.NoError(t, <-withdrawn)
	row, err := e.ops.InspectMessage(context.Background(), "c", "m1")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusDone, row.Status, row.LastError)
	require.Equal(t, 1, row.Attempts)
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, 1, e.effects(t))
}

// TxOptions that fail every processing transaction (issue 34, item 3) are refused at
// construction with the field named.
func TestProcessorTxOptionsThatCannotWorkAreRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	for want, opts := range map[string]*sql.TxOptions{
		"TxOptions.ReadOnly must be false": {ReadOnly: true},
		"PostgreSQL has no SNAPSHOT":       {Isolation: sql.LevelSnapshot},
		"TxOptions.Isolation must be":      {Isolation: sql.LevelLinearizable},
	} {
		_, err := inbox.NewProcessor(db, h, inbox.ProcessorConfig{Consumer: "c", TxOptions: opts}, nil)
		require.ErrorContains(t, err, "inbox: invalid")
		require.ErrorContains(t, err, want)
	}
}
