package once_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/once"
	"github.com/wmonce/watermill-once/oncetype"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// env is one test's schema with a business table the handlers write to.
type env struct {
	db     *sql.DB
	schema string
	mw     *once.Middleware
}

func newEnv(t *testing.T, cfg once.Config) *env {
	t.Helper()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "effects")+` (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL)`)
	cfg.Schema = schema
	mw, err := once.New(db, cfg, watermill.NewStdLogger(false, false))
	require.NoError(t, err)
	return &env{db: db, schema: schema, mw: mw}
}

func (e *env) table(name string) string { return pgtx.QualifiedName(e.schema, name) }

// effect is a handler that records one effect row in the message's transaction.
func (e *env) effect(msg *message.Message) ([]*message.Message, error) {
	tx, ok := pgtx.TxFromContext(msg.Context())
	if !ok {
		return nil, errors.New("no tx in context")
	}
	_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+e.table("effects")+` (key, amount) VALUES ($1, 1)`, msg.UUID)
	return nil, err
}

func (e *env) effects(t *testing.T) int {
	return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects"))
}

func (e *env) claims(t *testing.T) int {
	return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("processed_messages"))
}

// deliver hands one copy of a message to the wrapped handler, as a subscriber would, and
// returns what the router would see: nil means ack.
func deliver(h message.HandlerFunc, uuid string, payload string) error {
	_, err := h(message.NewMessage(uuid, []byte(payload)))
	return err
}

func TestReplayFiveTimesAppliesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "rewards"})
	h := e.mw.Middleware(e.effect)

	for range 5 {
		require.NoError(t, deliver(h, "e-91", `{"amount":120000}`), "every copy is acked")
	}
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, once.Counters{Fresh: 1, Duplicates: 4}, e.mw.Counters("rewards"))

	require.NoError(t, deliver(h, "e-92", `{"amount":5}`))
	require.Equal(t, 2, e.effects(t), "a new id is a new effect")
}

func TestConsumersAreScopedApart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "rewards"})
	other, err := once.New(e.db, once.Config{Schema: e.schema, Consumer: "notifications"}, nil)
	require.NoError(t, err)
	rewards, notifications := e.mw.Middleware(e.effect), other.Middleware(e.effect)
	require.NoError(t, deliver(rewards, "e-1", "x"))
	require.NoError(t, deliver(notifications, "e-1", "x"))
	require.NoError(t, deliver(rewards, "e-1", "x"))
	require.Equal(t, 2, e.effects(t), "each consumer applies the event once")
	require.Equal(t, uint64(1), e.mw.Counters("rewards").Duplicates)
}

func TestConcurrentCopiesApplyExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "rewards"})
	// The winner holds its row lock while it "works", so the others really wait on the key.
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		time.Sleep(50 * time.Millisecond)
		return e.effect(msg)
	})
	const copies = 16
	var wg sync.WaitGroup
	errs := make(chan error, copies)
	start := make(chan struct{})
	for range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs <- deliver(h, "same-id", "payload")
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "every copy is acked, none errors")
	}
	require.Equal(t, 1, e.effects(t))
	c := e.mw.Counters("rewards")
	require.Equal(t, uint64(1), c.Fresh)
	require.Equal(t, uint64(copies-1), c.Duplicates)
}

func TestHandlerFailureLeavesNoClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "rewards"})
	var calls atomic.Int32
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if _, err := e.effect(msg); err != nil {
			return nil, err
		}
		if calls.Add(1) == 1 {
			return nil, errors.New("downstream hiccup")
		}
		return nil, nil
	})
	require.ErrorContains(t, deliver(h, "e-1", "p"), "downstream hiccup")
	require.Zero(t, e.claims(t), "a failed handler leaves no dedupe row")
	require.Zero(t, e.effects(t), "and none of its writes")

	require.NoError(t, deliver(h, "e-1", "p"), "the redelivery applies it")
	require.NoError(t, deliver(h, "e-1", "p"))
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, 1, e.claims(t))
}

func TestPanicRollsBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "rewards"})
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		_, _ = e.effect(msg)
		panic("boom")
	})
	err := deliver(h, "e-1", "p")
	require.True(t, oncetype.IsPanic(err), "got %v", err)
	require.Zero(t, e.claims(t))
	require.Zero(t, e.effects(t))
}

func TestDuplicateWithDifferentPayloadIsReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "rewards"})
	h := e.mw.Middleware(e.effect)
	require.NoError(t, deliver(h, "e-1", `{"amount":1}`))
	require.NoError(t, deliver(h, "e-1", `{"amount":1}`))
	require.NoError(t, deliver(h, "e-1", `{"amount":999}`), "acked by default, but reported")
	c := e.mw.Counters("rewards")
	require.Equal(t, uint64(2), c.Duplicates)
	require.Equal(t, uint64(1), c.FingerprintMismatches)
	require.Equal(t, 1, e.effects(t))

	strict := newEnv(t, once.Config{Consumer: "rewards", RejectFingerprintMismatch: true})
	hs := strict.mw.Middleware(strict.effect)
	require.NoError(t, deliver(hs, "e-1", `{"amount":1}`))
	err := deliver(hs, "e-1", `{"amount":999}`)
	require.True(t, oncetype.IsPermanent(err), "refused as permanent so the stack parks it: %v", err)
	require.ErrorContains(t, err, "fingerprint mismatch")
}

func TestKeyStrategies(t *testing.T) {
	t.Parallel()
	t.Run("metadata", func(t *testing.T) {
		e := newEnv(t, once.Config{Consumer: "c", Key: oncetype.KeyFromMetadata("event_id")})
		h := e.mw.Middleware(e.effect)
		for i := range 3 {
			msg := message.NewMessage(fmt.Sprintf("transport-%d", i), []byte("p")) // new transport id each time
			msg.Metadata.Set("event_id", "evt-1")
			_, err := h(msg)
			require.NoError(t, err)
		}
		require.Equal(t, 1, e.effects(t))
		_, err := h(message.NewMessage("x", []byte("p")))
		require.ErrorIs(t, err, oncetype.ErrInvalidKey)
		require.ErrorContains(t, err, `metadata field "event_id" is missing`)
		require.True(t, oncetype.IsPermanent(err))
	})
	t.Run("payload sha256", func(t *testing.T) {
		e := newEnv(t, once.Config{Consumer: "c", Key: oncetype.KeyFromPayloadSHA256()})
		h := e.mw.Middleware(e.effect)
		for i := range 3 {
			_, err := h(message.NewMessage(fmt.Sprintf("t-%d", i), []byte(`{"same":"bytes"}`)))
			require.NoError(t, err)
		}
		_, err := h(message.NewMessage("t-9", []byte(`{"other":"bytes"}`)))
		require.NoError(t, err)
		require.Equal(t, 2, e.effects(t))
		var key string
		require.NoError(t, e.db.QueryRow(`SELECT message_id FROM `+e.table("processed_messages")+` ORDER BY processed_at LIMIT 1`).Scan(&key))
		require.Len(t, key, 64)
	})
	t.Run("business key", func(t *testing.T) {
		e := newEnv(t, once.Config{Consumer: "c", Key: oncetype.KeyFromFunc(func(m *message.Message) (string, error) {
			return "payment:" + string(m.Payload), nil
		})})
		h := e.mw.Middleware(e.effect)
		_, err := h(message.NewMessage("a", []byte("pay_42")))
		require.NoError(t, err)
		_, err = h(message.NewMessage("b", []byte("pay_42")))
		require.NoError(t, err)
		require.Equal(t, 1, e.effects(t))
	})
	t.Run("empty and over-long keys are refused, not applied", func(t *testing.T) {
		e := newEnv(t, once.Config{Consumer: "c", MaxKeyLength: 10})
		h := e.mw.Middleware(e.effect)
		_, err := h(message.NewMessage("", []byte("p")))
		require.ErrorIs(t, err, oncetype.ErrInvalidKey)
		require.ErrorContains(t, err, "UUID is empty")
		_, err = h(message.NewMessage("0123456789abc", []byte("p")))
		require.ErrorIs(t, err, oncetype.ErrInvalidKey)
		require.ErrorContains(t, err, "raise MaxKeyLength")
		_, err = h(message.NewMessage("bad\x00key", []byte("p")))
		require.ErrorIs(t, err, oncetype.ErrInvalidKey)
		require.Zero(t, e.effects(t))
		require.Zero(t, e.claims(t))
		require.Equal(t, uint64(3), e.mw.Counters("c").Refused)
	})
	t.Run("no consumer name", func(t *testing.T) {
		e := newEnv(t, once.Config{})
		_, err := e.mw.Middleware(e.effect)(message.NewMessage("a", []byte("p")))
		require.ErrorIs(t, err, once.ErrNoConsumer)
		require.Zero(t, e.effects(t))
	})
}

func TestInvalidConfigFailsAtConstruction(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	for name, cfg := range map[string]once.Config{
		"bad schema":       {Schema: `public"; DROP TABLE x; --`},
		"blank consumer":   {Consumer: "   "},
		"key too long":     {MaxKeyLength: 5000},
		"bad output":       {OutputTopic: "has space"},
		"negative retries": {TxRetry: pgtx.RetryPolicy{MaxAttempts: -1}},
	} {
		_, err := once.New(db, cfg, nil)
		require.Error(t, err, name)
		require.ErrorContains(t, err, "invalid config", name)
	}
	// A consumer PostgreSQL cannot store fails here, by the rule every component applies (the
	// inbox Receiver refuses the same name), not at the first message's claim.
	for consumer, want := range map[string]string{
		"pay\x00ments": "Consumer must not contain NUL bytes",
		"pay\xffments": "Consumer must be valid UTF-8",
	} {
		_, err := once.New(db, once.Config{Consumer: consumer}, nil)
		require.ErrorContains(t, err, "invalid config")
		require.ErrorContains(t, err, want)
	}
	_, err := once.New(nil, once.Config{}, nil)
	require.ErrorContains(t, err, "db is nil")

	// An unreachable database fails when it is opened, not at the first message.
	_, err = pgtx.Open(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", pgtx.PoolConfig{PingTimeout: 3 * time.Second})
	require.ErrorContains(t, err, "cannot reach PostgreSQL")
}

func TestMissingMigrationsSaySo(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	mw, err := once.New(db, once.Config{Schema: pgtest.NewName("nothing"), Consumer: "c"}, nil)
	require.NoError(t, err)
	_, err = mw.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("a", nil))
	require.ErrorContains(t, err, "run the migrations")
}

func TestOutputsGoToOutboxOnlyOnCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "rewards", OutputTopic: "cashback"})
	fail := true
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		out := message.NewMessage("out-"+msg.UUID, []byte(`{"paise":2400}`))
		if fail {
			return []*message.Message{out}, errors.New("fails after producing")
		}
		return []*message.Message{out}, nil
	})
	require.Error(t, deliver(h, "e-91", "p"))
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))

	fail = false
	in := message.NewMessage("e-91", []byte("p"))
	in.Metadata.Set("correlation_id", "corr-7")
	out, err := h(in)
	require.NoError(t, err)
	require.Nil(t, out, "the router publishes nothing itself")
	require.NoError(t, deliver(h, "e-91", "p"))
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))

	// The relay forwards it with its UUID, metadata and the stamped causation/correlation ids.
	target := newCapture()
	relay, err := outbox.NewRelay(e.db, target, outbox.RelayConfig{Schema: e.schema}, nil)
	require.NoError(t, err)
	// A row becomes readable once every older transaction on the server has ended; parallel
	// tests keep some open, so poll.
	deadline := time.Now().Add(10 * time.Second)
	for len(target.all()) == 0 && time.Now().Before(deadline) {
		_, err := relay.RelayOnce(context.Background())
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
	}
	got := target.all()
	require.Len(t, got, 1)
	require.Equal(t, "cashback", got[0].topic)
	require.Equal(t, "out-e-91", got[0].msg.UUID)
	require.Equal(t, "e-91", got[0].msg.Metadata.Get(outbox.MetadataCausationID))
	require.Equal(t, "corr-7", got[0].msg.Metadata.Get(outbox.MetadataCorrelationID))
	require.NotEmpty(t, got[0].msg.Metadata.Get(outbox.MetadataOccurredAt))
	require.JSONEq(t, `{"paise":2400}`, string(got[0].msg.Payload))
}

func TestOutputsWithoutTopicArePermanentErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		_, _ = e.effect(msg)
		return []*message.Message{message.NewMessage("o", nil)}, nil
	})
	err := deliver(h, "e-1", "p")
	require.ErrorIs(t, err, oncetype.ErrOutputWithoutTopic)
	require.True(t, oncetype.IsPermanent(err))
	require.Zero(t, e.effects(t), "rolled back")
}

func TestPublisherFromContextJoinsTheTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	pub := w.Publisher()
	fail := true
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		out := message.NewMessage("sms-"+msg.UUID, []byte("hi"))
		out.SetContext(msg.Context())
		if err := pub.Publish("sms", out); err != nil {
			return nil, err
		}
		if fail {
			return nil, errors.New("after publish")
		}
		return nil, nil
	})
	require.Error(t, deliver(h, "e-1", "p"))
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")), "a rolled-back publish leaves nothing")
	fail = false
	require.NoError(t, deliver(h, "e-1", "p"))
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))

	// Without a transaction in the context the publisher refuses instead of sending around it.
	err = pub.Publish("sms", message.NewMessage("x", nil))
	require.ErrorIs(t, err, pgtx.ErrNoTransaction)
}

func TestSerializationFailureRetriesWholeTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{
		Consumer:  "c",
		TxOptions: &sql.TxOptions{Isolation: sql.LevelSerializable},
	})
	pgtest.Exec(t, e.db, `CREATE TABLE `+e.table("balance")+` (id int PRIMARY KEY, v int NOT NULL)`)
	pgtest.Exec(t, e.db, `INSERT INTO `+e.table("balance")+` VALUES (1, 0)`)
	// Two handlers read-modify-write the same row at once under SERIALIZABLE: one of them must
	// fail with 40001 and be re-run; both increments land.
	var barrier sync.WaitGroup
	barrier.Add(2)
	var attempts atomic.Int32
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgtx.TxFromContext(msg.Context())
		var v int
		if err := tx.QueryRowContext(msg.Context(), `SELECT v FROM `+e.table("balance")+` WHERE id = 1`).Scan(&v); err != nil {
			return nil, err
		}
		if attempts.Add(1) <= 2 {
			barrier.Done()
			barrier.Wait()
		}
		_, err := tx.ExecContext(msg.Context(), `UPDATE `+e.table("balance")+` SET v = $1 WHERE id = 1`, v+1)
		return nil, err
	})
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, deliver(h, id, "p"))
		}()
	}
	wg.Wait()
	require.Equal(t, 2, pgtest.Count(t, e.db, `SELECT v FROM `+e.table("balance")))
	require.Equal(t, uint64(1), e.mw.Counters("c").TxRetries)
}

// capture is a publisher that remembers what it was given: the relay's target in unit tests.
type capture struct {
	mu   sync.Mutex
	msgs []captured
}

type captured struct {
	topic string
	msg   *message.Message
}

func newCapture() *capture { return &capture{} }

func (c *capture) Publish(topic string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		c.msgs = append(c.msgs, captured{topic, m})
	}
	return nil
}

func (c *capture) Close() error { return nil }

func (c *capture) all() []captured {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]captured(nil), c.msgs...)
}
