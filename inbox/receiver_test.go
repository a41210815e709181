package inbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/outbox"
)

// A burst of concurrent deliveries lands in few statements (group commit), every delivery is
// acked only after its row committed, and the processor then applies each message once.
func TestBurstIngestedThenProcessed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "payments", Workers: 1})
	sig := receiverSignals(r)

	// Hold the single writer on a row lock: a transaction of ours inserts the key of the first
	// message and stays open, so the writer's INSERT waits on the unique index while the rest
	// of the burst queues up behind it.
	blocker, err := e.db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = blocker.Rollback() }) // never left open by a failed check: it holds back every SQL subscription on the server
	_, err = blocker.Exec(`INSERT INTO ` + e.table("inbox") + ` (consumer, message_id, message_uuid, payload) VALUES ('payments', 'm-0', 'm-0', '')`)
	require.NoError(t, err)

	const burst = 300
	errs := make(chan error, burst+1)
	go func() { errs <- r.Handle(msg("m-0", "p0", "seq", "0")) }()
	require.Equal(t, 1, sig.BatchTaken.WaitOrTimeout(), "the held row is written alone, by its own Handle")
	for i := 1; i <= burst; i++ {
		go func() { errs <- r.Handle(msg(fmt.Sprintf("m-%d", i), fmt.Sprintf("p%d", i), "seq", fmt.Sprint(i))) }()
	}
	for range burst {
		sig.Queued.WaitOrTimeout()
	}
	require.Equal(t, int64(burst+1), r.Counters().Waiting, "the burst queues behind the held row, whose Handle waits for its write")
	require.Zero(t, r.Counters().Stored, "nothing is acked while the write is held")
	require.NoError(t, blocker.Rollback())

	for range burst + 1 {
		require.NoError(t, <-errs)
	}
	c := r.Counters()
	require.Equal(t, uint64(burst+1), c.Stored)
	require.Equal(t, uint64(2), c.Batches, "the held row, then the whole queued burst in one statement")
	require.Equal(t, burst+1, e.status(t, "payments", inbox.StatusPending))

	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if want := "p" + m.Metadata.Get("seq"); string(m.Payload) != want {
			return nil, fmt.Errorf("payload %q, want %q", m.Payload, want)
		}
		return nil, e.effect(m, "w")
	}, fast("payments"))
	p.until(t, "every row to be processed", func(n tally) bool { return n.Done == burst+1 })
	require.Equal(t, burst+1, e.effects(t))
	require.Equal(t, burst+1, pgtest.Count(t, e.db, `SELECT count(DISTINCT message_id) FROM `+e.table("effects")))
	require.Equal(t, burst+1, e.status(t, "payments", inbox.StatusDone))
	require.Zero(t, p.Counters().Failed)
	st, err := e.ops.Stats(context.Background(), "payments")
	require.NoError(t, err)
	require.Equal(t, inbox.Stats{}, st)
}

// Every copy of a message is acked; only the first inserts a row, and the message is
// processed once, even when copies arrive after it was processed.
func TestDuplicatesIngestedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	const messages, copies = 40, 4
	var wg sync.WaitGroup
	for i := range messages {
		for range copies {
			wg.Go(func() { require.NoError(t, r.Handle(msg(fmt.Sprintf("e-%d", i), "x"))) })
		}
	}
	wg.Wait()
	require.Equal(t, messages, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")))
	c := r.Counters()
	require.Equal(t, uint64(messages), c.Stored)
	require.Equal(t, uint64(messages*(copies-1)), c.Duplicates)

	p := e.start(t, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "w") }, fast("c"))
	p.until(t, "processing", func(n tally) bool { return n.Done == messages })

	// Late copies (a redelivery after processing) are acked and change nothing.
	for i := range messages {
		require.NoError(t, r.Handle(msg(fmt.Sprintf("e-%d", i), "x")))
	}
	require.Equal(t, uint64(messages*copies), r.Counters().Duplicates)
	require.Equal(t, messages, e.status(t, "c", inbox.StatusDone))
	require.Equal(t, messages, e.effects(t))
}

// A message without a usable key, ordering key or metadata is refused with a permanent error
// (so a poison queue parks it) and stores nothing; its batch neighbours are not affected.
func TestRefusesUnusableMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{
		Consumer:     "c",
		Key:          wmonce.KeyFromMetadata("event_id"),
		MaxKeyLength: 16,
		OrderingKey:  wmonce.KeyFromMetadata("account"),
	})
	cases := map[string]struct {
		msg  *message.Message
		want error
	}{
		"no key":          {msg("u1", "p", "account", "a"), wmonce.ErrInvalidKey},
		"long key":        {msg("u2", "p", "account", "a", "event_id", strings.Repeat("k", 17)), wmonce.ErrInvalidKey},
		"binary key":      {msg("u3", "p", "account", "a", "event_id", "k\xff"), wmonce.ErrInvalidKey},
		"no ordering key": {msg("u4", "p", "event_id", "k4"), inbox.ErrInvalidOrderingKey},
		"long order key":  {msg("u5", "p", "event_id", "k5", "account", strings.Repeat("a", 17)), inbox.ErrInvalidOrderingKey},
		"NUL in metadata": {msg("u6", "p", "event_id", "k6", "account", "a", "note", "a\x00b"), inbox.ErrInvalidMetadata},
		"bad UTF-8":       {msg("u7", "p", "event_id", "k7", "account", "a", "note\xfe", "x"), inbox.ErrInvalidMetadata},
	}
	var wg sync.WaitGroup
	i := 0
	for name, tc := range cases {
		i++
		okKey := fmt.Sprintf("ok-%d", i)
		wg.Go(func() {
			err := r.Handle(tc.msg)
			require.ErrorIs(t, err, tc.want, name)
			require.True(t, wmonce.IsPermanent(err), name)
		})
		wg.Go(func() { require.NoError(t, r.Handle(msg(okKey, "p", "event_id", okKey, "account", "a"))) })
	}
	wg.Wait()
	require.Equal(t, uint64(len(cases)), r.Counters().Refused)
	require.Equal(t, len(cases), pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")))
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")+` WHERE message_uuid LIKE 'u%'`))
}

// StoreTx writes within the caller's transaction: nothing is visible, and no processor is
// woken, unless it commits.
func TestStoreTxFollowsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	ctx := context.Background()

	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	n, err := r.StoreTx(ctx, tx, "orders", msg("a", "1"), msg("b", "2"), msg("a", "1"))
	require.NoError(t, err)
	require.Equal(t, 2, n, "the copy of a in the same call is a duplicate")
	require.NoError(t, tx.Rollback())
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")))

	tx, err = e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	n, err = r.StoreTx(ctx, tx, "orders", msg("a", "1"), msg("b", "2"))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.NoError(t, tx.Commit())
	row, err := e.ops.InspectMessage(ctx, "c", "b")
	require.NoError(t, err)
	require.Equal(t, "orders", row.Topic)
	require.Equal(t, []byte("2"), row.Payload)

	// One bad message fails the call before anything is written.
	tx, err = e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = r.StoreTx(ctx, tx, "orders", msg("c", "3"), msg("", "no uuid"))
	require.ErrorIs(t, err, wmonce.ErrInvalidKey)
}

func TestReceiverRefusesAfterClose(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	require.NoError(t, r.Handle(msg("a", "1")))
	require.NoError(t, r.Close())
	require.NoError(t, r.Close(), "Close is idempotent")
	require.ErrorIs(t, r.Handle(msg("b", "2")), inbox.ErrReceiverClosed)
}

func TestMissingMigrationsSaySo(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	r, err := inbox.NewReceiver(db, inbox.ReceiverConfig{Schema: pgtest.NewName("nothing"), Consumer: "c"}, nil)
	require.NoError(t, err)
	defer r.Close()
	require.ErrorContains(t, r.Handle(msg("a", "1")), "run the migrations")
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	for name, cfg := range map[string]inbox.ReceiverConfig{
		"no consumer":    {},
		"blank consumer": {Consumer: "  "},
		"NUL consumer":   {Consumer: "pay\x00ments"},
		"bad schema":     {Consumer: "c", Schema: "x; DROP TABLE y"},
		"key too long":   {Consumer: "c", MaxKeyLength: setup.MaxKeyLengthLimit + 1},
		"batch too big":  {Consumer: "c", BatchSize: inbox.MaxBatchSize + 1},
		"writers":        {Consumer: "c", Workers: -1},
		"linger":         {Consumer: "c", Linger: time.Hour},
		"negative age":   {Consumer: "c", MaxMessageAge: -time.Second},
	} {
		_, err := inbox.NewReceiver(db, cfg, nil)
		require.ErrorContains(t, err, "invalid receiver config", name)
	}
	_, err := inbox.NewReceiver(nil, inbox.ReceiverConfig{Consumer: "c"}, nil)
	require.ErrorContains(t, err, "db is nil")

	h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	for name, cfg := range map[string]inbox.ProcessorConfig{
		"no consumer":        {},
		"NUL consumer":       {Consumer: "pay\x00ments"},
		"bad schema":         {Consumer: "c", Schema: "Upper"},
		"workers":            {Consumer: "c", Workers: -2},
		"tx batch > claim":   {Consumer: "c", BatchSize: 4, TxBatchSize: 5},
		"lease too short":    {Consumer: "c", Lease: time.Millisecond},
		"renew >= lease":     {Consumer: "c", Lease: time.Second, RenewInterval: time.Second},
		"attempts":           {Consumer: "c", MaxAttempts: -1},
		"backoff above max":  {Consumer: "c", Backoff: time.Minute, MaxBackoff: time.Second},
		"output topic space": {Consumer: "c", OutputTopic: "a b"},
	} {
		_, err := inbox.NewProcessor(db, h, cfg, nil)
		require.ErrorContains(t, err, "invalid processor config", name)
	}
	_, err = inbox.NewProcessor(db, nil, inbox.ProcessorConfig{Consumer: "c"}, nil)
	require.ErrorContains(t, err, "handler is nil")
	_, err = inbox.NewOps(db, inbox.OpsConfig{Schema: `"quoted"`}, nil)
	require.ErrorContains(t, err, "invalid ops config")

	// Errors say what to fix.
	_, err = inbox.NewProcessor(db, h, inbox.ProcessorConfig{Consumer: "c", BatchSize: 4, TxBatchSize: 5}, nil)
	require.ErrorContains(t, err, "TxBatchSize must be between 1 and BatchSize (4), got 5")
}

// The age guard (MaxMessageAge) has the middleware's semantics: a copy whose key is gone from
// the inbox (deleted by retention) and whose event is older than the limit is not processed
// again; it is parked as FAILED, visibly, and acked. A copy whose key is still there is a
// duplicate whatever its age.
func TestAgeGuardParksOldCopiesOfForgottenKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	occurred := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) func() time.Time { return func() time.Time { return occurred.Add(d) } }
	event := func(id string) *message.Message {
		return msg(id, "p", outbox.MetadataOccurredAt, occurred.Format(time.RFC3339Nano))
	}
	guarded := func(now func() time.Time) *inbox.Receiver {
		return e.receiver(t, inbox.ReceiverConfig{Consumer: "c", MaxMessageAge: time.Hour, Now: now})
	}

	// The originals arrive in time.
	early := guarded(at(time.Minute))
	require.NoError(t, early.Handle(event("kept")))
	require.NoError(t, early.Handle(event("forgotten")))
	require.Equal(t, uint64(2), early.Counters().Stored)
	// Both are applied; retention later deletes one of them.
	pgtest.Exec(t, e.db, `UPDATE `+e.table("inbox")+` SET status = 'DONE', finished_at = now()`)
	pgtest.Exec(t, e.db, `DELETE FROM `+e.table("inbox")+` WHERE message_id = 'forgotten'`)

	// Two hours on, copies come back (a DLQ redrive, an offset reset).
	late := guarded(at(2 * time.Hour))
	require.NoError(t, late.Handle(event("kept")), "a duplicate is acked")
	require.NoError(t, late.Handle(event("forgotten")), "a parked copy is acked: the inbox holds it")
	require.NoError(t, late.Handle(msg("timeless", "p")), "messages without a time are not checked")
	err := late.Handle(msg("garbled", "p", outbox.MetadataOccurredAt, "yesterday"))
	require.ErrorIs(t, err, wmonce.ErrMalformedMetadata)
	require.True(t, wmonce.IsPermanent(err))
	require.NoError(t, late.Handle(event("forgotten")), "a second copy is a duplicate of the parked row")

	c := late.Counters()
	require.Equal(t, uint64(1), c.TooOld)
	require.Equal(t, uint64(1), c.Stored, "only the timeless message is stored for processing")
	require.Equal(t, uint64(2), c.Duplicates)
	require.Equal(t, uint64(1), c.Refused)
	row, err := e.ops.InspectMessage(context.Background(), "c", "forgotten")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusFailed, row.Status)
	require.Zero(t, row.Attempts)
	require.Contains(t, row.LastError, wmonce.ErrTooOld.Error())
	row, err = e.ops.InspectMessage(context.Background(), "c", "kept")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusDone, row.Status)

	// StoreTx applies the same guard.
	tx, err := e.db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	n, err := late.StoreTx(context.Background(), tx, "t", event("old-in-tx"))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, tx.Commit())
	require.Equal(t, 2, e.status(t, "c", inbox.StatusFailed))

	// The processor leaves parked copies alone.
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "w") }, fast("c"))
	p.until(t, "the timeless message processed", func(n tally) bool { return n.Done == 1 })
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, 2, e.status(t, "c", inbox.StatusFailed))
}
