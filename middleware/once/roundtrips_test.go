package once_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// countedEnv is a schema reached through a pool of its own whose round trips are counted.
func countedEnv(t *testing.T, lazyBegin bool) (*env, *pgtx.RoundTripCounter) {
	t.Helper()
	pgtest.SkipShort(t)
	rt := &pgtx.RoundTripCounter{}
	db, err := pgtx.Open(context.Background(), pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 4, DisableLazyBegin: !lazyBegin, RoundTrips: rt})
	require.NoError(t, err, "these tests need PostgreSQL: start it or set DATABASE_URL")
	t.Cleanup(func() { _ = db.Close() })
	schema := pgtest.Schema(t, db)
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "effects")+` (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL)`)
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "c"}, nil)
	require.NoError(t, err)
	return &env{db: db, schema: schema, mw: mw}, rt
}

// perMessage returns the round trips one call of h costs, once statement caches are warm.
func perMessage(t *testing.T, rt *pgtx.RoundTripCounter, h message.HandlerFunc, id string) int64 {
	t.Helper()
	_, err := h(message.NewMessage(id+"-warm", []byte("p")))
	require.NoError(t, err)
	const n = 10
	before := rt.Load()
	for i := range n {
		_, err := h(message.NewMessage(fmt.Sprintf("%s-%d", id, i), []byte("p")))
		require.NoError(t, err)
	}
	got := rt.Load() - before
	require.Zero(t, got%n, "round trips per message are not constant: %d for %d messages", got, n)
	return got / n
}

// The own-transaction path: claim, handler write, commit; BEGIN travels with the claim, and the
// attempt guard opens in the claim and closes with COMMIT.
// An at-least-once handler doing the same write in its own transaction pays one less.
func TestRoundTripsPerMessageOwnTx(t *testing.T) {
	t.Parallel()
	for _, lazy := range []bool{false, true} {
		e, rt := countedEnv(t, lazy)
		eo := perMessage(t, rt, e.mw.Middleware(e.effect), "eo")
		alo := perMessage(t, rt, func(msg *message.Message) ([]*message.Message, error) {
			return nil, pgtx.RunInTx(msg.Context(), e.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
				return first(e.effect(withCtx(message.NewMessage(msg.UUID, nil), pgtx.ContextWithTx(ctx, tx))))
			})
		}, "alo")
		if lazy {
			require.Equal(t, int64(3), eo, "claim (with BEGIN), handler write, COMMIT")
			require.Equal(t, int64(2), alo, "handler write (with BEGIN), COMMIT")
		} else {
			// Without lazy BEGIN the guard's close (internal/txguard) cannot travel with COMMIT.
			require.Equal(t, int64(5), eo, "BEGIN, claim, handler write, attempt guard's close, COMMIT")
			require.Equal(t, int64(3), alo, "BEGIN, handler write, COMMIT")
		}
	}
}

// With group commit on, a message alone in flight runs exactly as without it.
func TestRoundTripsPerMessageGroupCommitAlone(t *testing.T) {
	t.Parallel()
	e, rt := countedEnv(t, true)
	mw, err := once.New(e.db, once.Config{Schema: e.schema, Consumer: "c", GroupCommit: once.GroupCommitConfig{}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mw.Close() })
	require.Equal(t, int64(3), perMessage(t, rt, mw.Middleware(e.effect), "gc"), "claim (with BEGIN), handler write, COMMIT")
	txs := mw.Counters().GroupCommitTransactions
	require.Zero(t, txs, "no group was formed")
}

func first(_ []*message.Message, err error) error { return err }

func withCtx(msg *message.Message, ctx context.Context) *message.Message {
	msg.SetContext(ctx)
	return msg
}

// The watermill-sql subscriber-transaction path: what the middleware adds to a plain handler in
// the subscriber's transaction is one round trip: the savepoint, the attempt guard and the claim
// go together, and the release travels with the next statement (the subscriber's offset update
// and COMMIT here).
func TestRoundTripsPerMessageSubscriberTx(t *testing.T) {
	t.Parallel()
	e, rt := countedEnv(t, true)
	measure := func(name string, h message.HandlerFunc) float64 {
		const n = 12
		pub, sub := sqlPubSub(t, e.db, e.schema, name)
		topic := name
		for i := range n {
			require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("%s-%d", name, i), []byte(`{}`))))
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		var start int64
		for i := range n {
			var msg *message.Message
			select {
			case msg = <-msgs:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: message %d not delivered", name, i)
			}
			switch i {
			case 2: // warm: statement caches, first polls
				start = rt.Load()
			case n - 1:
				msg.Nack()
				return float64(rt.Load()-start) / float64(n-3)
			}
			_, err := h(msg)
			require.NoError(t, err)
			msg.Ack()
		}
		panic("unreachable")
	}
	plain := measure("plain", func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := pgtx.SubscriberTxFromContext(msg.Context())
		require.True(t, ok)
		return e.effect(withCtx(message.NewMessage(msg.UUID, nil), pgtx.ContextWithTx(msg.Context(), tx)))
	})
	eo := measure("eo", e.mw.Middleware(e.effect))
	t.Logf("round trips per message: plain subscriber handler %.2f, effectively-once %.2f", plain, eo)
	require.InDelta(t, 1, eo-plain, 0.5, "savepoint+guard+claim in one round trip, release deferred (plain %.2f, effectively-once %.2f)", plain, eo)
	require.Equal(t, 2*11, e.effects(t), "every message handled was applied once")
}

// The subscriber path sends the claim with the simple protocol (pgx quotes the arguments): the
// day of a daily partition, the key and the fingerprint must arrive intact, and a missing
// partition is created and the message redelivered.
func TestSubscriberTxPartitionByDay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{PartitionByDay: true})
	pub, sub := sqlPubSub(t, e.db, e.schema, "rewards")
	topic := "payments"
	runRouter(t, "rewards", topic, sub, e.effect, e.mw.Middleware)
	acked := watchOffsets(t, e.db, e.schema).ackedOffsets(t, topic, "rewards")
	day := time.Date(2026, 11, 20, 23, 59, 0, 0, time.UTC)
	key := `it's "quoted" \ and ; not SQL`
	for range 2 {
		require.NoError(t, pub.Publish(topic, occurred(key, day, `{}`)))
	}
	waitAcked(t, acked, 2)
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table(partition.Name(day))+` WHERE message_id = $1`, key))
	c := e.mw.Counters().Consumer("rewards")
	require.Equal(t, uint64(1), c.Fresh)
	require.Equal(t, uint64(1), c.Duplicates)
	require.Zero(t, c.FingerprintMismatches)
}

// With an output: on a pool from pgtx.Open the outbox row is one more statement; on another
// pool (the server's attempt guard) the guard is also checked before the output is stored, so
// that a handler that sent COMMIT as SQL text cannot have the row stored in autocommit: one
// more round trip there (issue 34, item 2), none with lazy BEGIN.
func TestRoundTripsPerMessageWithOutput(t *testing.T) {
	t.Parallel()
	for _, lazy := range []bool{false, true} {
		e, rt := countedEnv(t, lazy)
		mw, err := once.New(e.db, once.Config{Schema: e.schema, Consumer: "c", OutputTopic: "out"}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = mw.Close() })
		got := perMessage(t, rt, mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if _, err := e.effect(msg); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte(`{}`))}, nil
		}), "out")
		if lazy {
			require.Equal(t, int64(4), got, "claim (with BEGIN), handler write, outbox row, COMMIT")
		} else {
			require.Equal(t, int64(7), got, "BEGIN, claim, handler write, guard check, outbox row, guard close, COMMIT")
		}
	}
}
