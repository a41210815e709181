package once_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// sqlPubSub is Watermill's SQL pub/sub with its topic tables inside the test schema.
func sqlPubSub(t *testing.T, db *sql.DB, schema, group string) (*wsql.Publisher, *wsql.Subscriber) {
	t.Helper()
	return sqlPubSubWithAckDeadline(t, db, schema, group, 30*time.Second)
}

func sqlPubSubWithAckDeadline(t *testing.T, db *sql.DB, schema, group string, ackDeadline time.Duration) (*wsql.Publisher, *wsql.Subscriber) {
	t.Helper()
	schemaAdapter := wsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string { return pgtx.QualifiedName(schema, "watermill_"+topic) },
		SubscribeBatchSize:        1,
	}
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string {
			return pgtx.QualifiedName(schema, "watermill_offsets_"+topic)
		},
	}
	logger := watermill.NopLogger{}
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schemaAdapter, AutoInitializeSchema: true}, logger)
	require.NoError(t, err)
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    schemaAdapter,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
		ResendInterval:   10 * time.Millisecond,
		AckDeadline:      &ackDeadline,
	}, logger)
	require.NoError(t, err)
	return pub, sub
}

// runRouter starts a router with one consumer handler and stops it when the test ends.
func runRouter(t *testing.T, name, topic string, sub message.Subscriber, h message.HandlerFunc, mws ...message.HandlerMiddleware) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddConsumerHandler(name, topic, sub, func(msg *message.Message) error {
		_, err := h(msg)
		return err
	}).AddMiddleware(mws...)
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestSQLSubscriberTransactionIsReused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{}) // consumer = handler name
	pub, sub := sqlPubSub(t, e.db, e.schema, "rewards")
	topic := "payments"

	var attempts, reused atomic.Int32
	handler := func(msg *message.Message) ([]*message.Message, error) {
		subTx, ok := pgtx.SubscriberTxFromContext(msg.Context())
		tx, _ := pgtx.TxFromContext(msg.Context())
		if ok && subTx == tx {
			reused.Add(1)
		}
		if _, err := e.effect(msg); err != nil {
			return nil, err
		}
		if attempts.Add(1) == 1 {
			return nil, errors.New("first attempt fails after writing")
		}
		return nil, nil
	}
	runRouter(t, "rewards", topic, sub, handler, e.mw.Middleware)
	acked := watchOffsets(t, e.db, e.schema).ackedOffsets(t, topic, "rewards")

	require.NoError(t, pub.Publish(topic, message.NewMessage("e-91", []byte(`{"amount":120000}`))))
	waitAcked(t, acked, 1)
	require.Equal(t, int32(2), attempts.Load())
	require.Equal(t, int32(2), reused.Load(), "both attempts ran in the subscriber's transaction")
	require.Equal(t, 1, e.effects(t), "the failed attempt's write was rolled back to its savepoint")
	require.Equal(t, 1, e.claims(t))
	require.Equal(t, once.Counters{Fresh: 1, Failed: 1}, e.mw.Counters().Consumer("rewards"))

	// The same event published again (a producer retry) is absorbed.
	require.NoError(t, pub.Publish(topic, message.NewMessage("e-91", []byte(`{"amount":120000}`))))
	waitAcked(t, acked, 2)
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, uint64(1), e.mw.Counters().Consumer("rewards").Duplicates)
	require.Zero(t, e.mw.Counters().Consumer("rewards").FingerprintMismatches, "the claim's arguments (quoted by pgx in the simple protocol) stored the payload's fingerprint exactly")
}

// watermill-sql's subscriber stops waiting for the ack after AckDeadline (and on Close) and then
// COMMITS its transaction, possibly while our handler is half way through. The attempt guard
// must make that commit fail, so that half an attempt (and its claim) never persists.
func TestSubscriberCommitDuringAttemptIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{})
	pub, sub := sqlPubSubWithAckDeadline(t, e.db, e.schema, "rewards", 300*time.Millisecond)
	topic := "payments"

	var runs atomic.Int32
	handler := func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgtx.TxFromContext(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+e.table("effects")+` (key, amount) VALUES ($1, 1)`, "part1"); err != nil {
			return nil, err
		}
		if runs.Add(1) == 1 {
			// Outlive the ack deadline: wait until the subscriber has ended its transaction.
			deadline := time.Now().Add(15 * time.Second)
			for time.Now().Before(deadline) {
				if _, err := tx.Exec(`SELECT 1`); errors.Is(err, sql.ErrTxDone) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+e.table("effects")+` (key, amount) VALUES ($1, 1)`, "part2")
		return nil, err
	}
	runRouter(t, "rewards", topic, sub, handler, e.mw.Middleware)
	acked := watchOffsets(t, e.db, e.schema).ackedOffsets(t, topic, "rewards")
	require.NoError(t, pub.Publish(topic, message.NewMessage("e-1", []byte(`{}`))))

	waitAcked(t, acked, 1)
	require.GreaterOrEqual(t, runs.Load(), int32(2), "the message was redelivered after the deadline")
	require.Equal(t, 2, e.effects(t), "both parts applied, once: no half attempt was committed")
	require.Equal(t, 2, pgtest.Count(t, e.db, `SELECT count(DISTINCT key) FROM `+e.table("effects")))
	require.Equal(t, 1, e.claims(t))
}

// The commit succeeds but the ack never reaches the broker: the copy that follows is a no-op
// and is acked. An outer middleware that fails after our commit plays the lost ack.
func TestLostAckRedeliveryIsNoOp(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{DisableSubscriberTxReuse: true})
	pub, sub := sqlPubSub(t, e.db, e.schema, "rewards")
	topic := "payments"

	var lost atomic.Bool
	lost.Store(true)
	loseFirstAck := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && lost.CompareAndSwap(true, false) {
				return nil, errors.New("ack lost on the way to the broker")
			}
			return out, err
		}
	}
	var deliveries atomic.Int32
	handler := func(msg *message.Message) ([]*message.Message, error) {
		deliveries.Add(1)
		return e.effect(msg)
	}
	runRouter(t, "rewards", topic, sub, func(msg *message.Message) ([]*message.Message, error) {
		return handler(msg)
	}, loseFirstAck, e.mw.Middleware)
	acked := watchOffsets(t, e.db, e.schema).ackedOffsets(t, topic, "rewards")

	require.NoError(t, pub.Publish(topic, message.NewMessage("e-1", []byte(`{}`))))
	waitAcked(t, acked, 1)
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, int32(1), deliveries.Load(), "the handler ran once")
	require.Equal(t, once.Counters{Fresh: 1, Duplicates: 1}, e.mw.Counters().Consumer("rewards"))
}

// Router.Close cancels in-flight message contexts; within ShutdownGrace the handler finishes
// and commits instead of being rolled back.
func TestShutdownGraceLetsRunningHandlerCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{DisableSubscriberTxReuse: true, ShutdownGrace: 5 * time.Second})
	pub, sub := sqlPubSub(t, e.db, e.schema, "rewards")
	topic := "payments"
	// The context the router gave the message, which Close cancels, seen outside the middleware.
	routerCtx := make(chan context.Context, 1)
	outer := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			routerCtx <- msg.Context()
			return h(msg)
		}
	}
	started := make(chan struct{})
	var sawCancel atomic.Bool
	detached := func(msg *message.Message) ([]*message.Message, error) {
		ctx := <-routerCtx
		close(started)
		<-ctx.Done() // still working when Close cancels the message
		sawCancel.Store(msg.Context().Err() != nil)
		return e.effect(msg)
	}
	r := runRouter(t, "rewards", topic, sub, detached, outer, e.mw.Middleware)
	require.NoError(t, pub.Publish(topic, message.NewMessage("e-1", []byte(`{}`))))
	testwait.Closed(t, started, "the handler to start")
	require.NoError(t, r.Close())
	require.False(t, sawCancel.Load(), "the handler's context survived Router.Close within the grace")
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, 1, e.claims(t))
}

func TestRelayDeliversOutputsThroughSQLPubSub(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{}) // outputs go to the handler's publish topic
	pub, sub := sqlPubSub(t, e.db, e.schema, "rewards")
	_, cashbackSub := sqlPubSub(t, e.db, e.schema, "notifications")

	handler := func(msg *message.Message) ([]*message.Message, error) {
		if _, err := e.effect(msg); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage("cb-"+msg.UUID, []byte(`{"paise":2400}`))}, nil
	}
	// The router's own publisher must never see the outputs: they travel through the outbox.
	direct := newCapture()
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddHandler("rewards", "payments", sub, "cashback", direct, handler).AddMiddleware(e.mw.Middleware)
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { _ = r.Close() })
	acked := watchOffsets(t, e.db, e.schema).ackedOffsets(t, "payments", "rewards")

	relay, err := outbox.NewRelay(e.db, pub, outbox.RelayConfig{Schema: e.schema, PollInterval: 10 * time.Millisecond}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = relay.Run(ctx) }()
	t.Cleanup(func() { _ = relay.Close() })

	received, err := cashbackSub.Subscribe(ctx, "cashback")
	require.NoError(t, err)

	for range 3 {
		require.NoError(t, pub.Publish("payments", message.NewMessage("e-91", []byte(`{"amount":120000}`))))
	}
	// watermill-sql shows a row only once every older transaction on the server has ended: the
	// shared timeout, not a tighter one, on a server busy with other tests.
	got := testwait.Receive(t, received, "the relay to deliver the output")
	got.Ack()
	require.Equal(t, "cb-e-91", got.UUID, "the original UUID survives the relay")
	require.Equal(t, "e-91", got.Metadata.Get(outbox.MetadataCausationID))
	waitAcked(t, acked, 3) // all copies consumed
	require.Equal(t, uint64(2), e.mw.Counters().Consumer("rewards").Duplicates)
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")), "one output for three copies")
	require.Empty(t, direct.all(), "the router published nothing around the transaction")
}
