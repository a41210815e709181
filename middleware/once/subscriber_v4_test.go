package once_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql4 "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// Watermill's own examples write through watermill-sql v4's sql.TxFromContext. The middleware
// must recognise that transaction as the subscriber's (savepoint per attempt), or a failed
// attempt's writes stay in it and are committed with the next successful one: two effects for
// one message.
func TestSubscriberTxV4FailedAttemptLeavesNothing(t *testing.T) {
	t.Parallel()
	e := newPathEnv(t, txPath{name: "subscriber-tx-v4", config: func(*once.Config) {}, subscriberTx: true, sql: 4}, once.Config{Consumer: "c"})
	fail := true
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := wsql4.TxFromContext(msg.Context()) // as Watermill's examples do
		if !ok {
			return nil, errors.New("no watermill-sql v4 transaction in the context")
		}
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+e.table("effects")+` (key, amount) VALUES ($1, 1)`, msg.UUID); err != nil {
			return nil, err
		}
		if fail {
			fail = false
			return nil, errors.New("fails after its write")
		}
		return nil, nil
	})
	require.Error(t, e.deliver(h, "e-1", "p"))
	require.Zero(t, e.effects(t), "the failed attempt was rolled back to its savepoint")
	require.Zero(t, e.claims(t))
	require.NoError(t, e.deliver(h, "e-1", "p"))
	require.NoError(t, e.deliver(h, "e-1", "p"))
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, once.Counters{Fresh: 1, Duplicates: 1, Failed: 1}, e.mw.Counters().Consumer("c"))
}

// A watermill-sql v4 subscriber over pgx (BeginnerFromPgx) delivers in a pgx.Tx that no
// *sql.Tx can join: the middleware refuses each message, applying nothing, rather than run the
// handler beside a transaction its writes may go to.
func TestSubscriberTxV4OverPgxIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	pool, err := pgxpool.New(context.Background(), pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, o := sqlAdaptersV4(e.schema)
	pub, err := wsql4.NewPublisher(wsql4.BeginnerFromPgx(pool), wsql4.PublisherConfig{SchemaAdapter: s, AutoInitializeSchema: true}, watermill.NopLogger{})
	require.NoError(t, err)
	require.NoError(t, pub.Publish("pgx", message.NewMessage("e-1", []byte(`{}`))))
	sub, err := wsql4.NewSubscriber(wsql4.BeginnerFromPgx(pool), wsql4.SubscriberConfig{
		ConsumerGroup: "suite", SchemaAdapter: s, OffsetsAdapter: o, InitializeSchema: true,
		PollInterval: 10 * time.Millisecond, ResendInterval: 10 * time.Millisecond,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(context.Background(), "pgx")
	require.NoError(t, err)
	msg := testwait.Receive(t, ch, "a message from the v4 subscriber over pgx")

	ran := false
	_, err = e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ran = true
		return e.effect(msg)
	})(msg)
	require.ErrorIs(t, err, pgtx.ErrUnsupportedSubscriberTx)
	require.False(t, ran, "the handler did not run")
	msg.Nack()
	require.Zero(t, e.effects(t))
	require.Equal(t, uint64(1), e.mw.Counters().Consumer("c").Refused)

	// With subscriber-transaction reuse off, the user says the handler writes only through
	// pgtx.TxFromContext: the middleware's own transaction then applies it.
	mw, err := once.New(e.db, once.Config{Schema: e.schema, Consumer: "c", DisableSubscriberTxReuse: true}, nil)
	require.NoError(t, err)
	msg = testwait.Receive(t, ch, "the nacked message again")
	_, err = mw.Middleware(e.effect)(msg)
	require.NoError(t, err)
	msg.Ack()
	require.Equal(t, 1, e.effects(t))
}

// TestSubscriberTxV4KilledConnectionIsReadAgainAtOnce: with the middleware in watermill-sql v4's
// own subscriber transaction, the subscriber's connection is terminated
// (pg_terminate_backend) while it holds a message. The delivery is acked into the dead
// transaction, so that v4 rolls back and reads the message again in a new one at once, where it
// is applied once; before, each attempt failed with "once: claim: driver: bad connection", was
// nacked and re-sent into the same dead transaction until v4's AckDeadline (30 s) discarded it
// (issue 34, item 11).
func TestSubscriberTxV4KilledConnectionIsReadAgainAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	subDB := pgtest.OpenDB(t, 4)
	s, o := sqlAdaptersV4(e.schema)
	pub, err := wsql4.NewPublisher(wsql4.BeginnerFromStdSQL(subDB), wsql4.PublisherConfig{SchemaAdapter: s, AutoInitializeSchema: true}, watermill.NopLogger{})
	require.NoError(t, err)
	require.NoError(t, pub.Publish("killed", message.NewMessage("e-1", []byte(`{}`))))
	ackDeadline := 30 * time.Second // v4's default, spelled out: the stall this test rules out
	sub, err := wsql4.NewSubscriber(wsql4.BeginnerFromStdSQL(subDB), wsql4.SubscriberConfig{
		ConsumerGroup: "suite", SchemaAdapter: s, OffsetsAdapter: o, InitializeSchema: true,
		PollInterval: 10 * time.Millisecond, ResendInterval: 10 * time.Millisecond, AckDeadline: &ackDeadline,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(context.Background(), "killed")
	require.NoError(t, err)
	h := e.mw.Middleware(e.effect)

	msg := testwait.Receive(t, ch, "the message in v4's subscriber transaction")
	tx, ok := pgtx.SubscriberTxFromContext(msg.Context())
	require.True(t, ok)
	var pid int
	require.NoError(t, tx.QueryRowContext(msg.Context(), `SELECT pg_backend_pid()`).Scan(&pid))
	var terminated bool
	require.NoError(t, e.db.QueryRow(`SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&terminated))
	require.True(t, terminated)

	start := time.Now()
	for deliveries := 1; ; deliveries++ {
		require.LessOrEqual(t, deliveries, 50, "the message is not applied: re-sent into the dead transaction")
		if _, err := h(msg); err != nil {
			msg.Nack()
		} else {
			msg.Ack()
		}
		// The subscriber commits after the ack: wait for the effect, or for the message again.
		var next *message.Message
		testwait.Until(t, "the effect, or the message again", func() bool {
			select {
			case next = <-ch:
				return true
			default:
				return e.effects(t) > 0
			}
		})
		if next == nil {
			break
		}
		msg = next
	}
	require.Less(t, time.Since(start), ackDeadline/3, "read again at once, not after AckDeadline")
	require.Equal(t, 1, e.effects(t))
	require.Positive(t, e.mw.Counters().Consumer("c").TxRetries, "the lost transaction is counted as a retry")
	require.Equal(t, uint64(1), e.mw.Counters().Consumer("c").Fresh)
}
