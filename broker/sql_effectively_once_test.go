package broker_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql4 "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// TestSQLSameConsumerOnTwoSubscriptionsSettlesTheLoserAtOnce delivers one event at the same
// time on two SQL-broker subscriptions whose handlers share one consumer name (a topic and its
// redrive topic). The middleware reuses each subscriber's REPEATABLE READ transaction. The copy
// whose snapshot predates the winner's commit fails its claim with 40001; retrying it in place
// keeps that snapshot and can never succeed, so it used to be nacked and re-sent in the same
// transaction until AckDeadline, holding back every SQL subscriber and relay meanwhile. It must
// be settled at once as a duplicate, without a single nack.
func TestSQLSameConsumerOnTwoSubscriptionsSettlesTheLoserAtOnce(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, testSQLSameConsumerOnTwoSubscriptionsSettlesTheLoserAtOnce)
}

func testSQLSameConsumerOnTwoSubscriptionsSettlesTheLoserAtOnce(t *testing.T, version int) {
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	topic, redrive := pgtest.NewName("payments"), pgtest.NewName("payments_redrive")
	cfg := sqlConfig(t, schema, version)
	// Bounds the run without the fix. Not shorter: on a loaded machine (CI runs packages side by
	// side) a 3 s deadline once passed while the copies were still settling, and the loser's
	// context ended before it could be told apart from a nack.
	cfg.SQL.AckDeadline = 20 * time.Second
	cfg.SQL.NackDelay = 10 * time.Millisecond
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "rewards"}, {Topic: redrive, Group: "rewards"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.New(ctx, db, cfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "effects")+` (key text NOT NULL)`)

	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "rewards"}, watermill.NopLogger{})
	require.NoError(t, err)

	// entered[topic] closes when a copy from topic reaches the middleware: its subscriber has
	// begun its transaction and taken its snapshot by then.
	entered := map[string]chan struct{}{topic: make(chan struct{}), redrive: make(chan struct{})}
	other := map[string]string{topic: redrive, redrive: topic}
	type outcome struct {
		topic string
		err   error
	}
	outcomes := make(chan outcome, 1000)
	var seen sync.Map
	observe := func(topic string) message.HandlerMiddleware {
		return func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				if _, loaded := seen.LoadOrStore(topic, true); !loaded {
					close(entered[topic])
				}
				out, err := h(msg)
				outcomes <- outcome{topic, err}
				return out, err
			}
		}
	}
	// The winner (whichever claims first) holds its claim until the other copy has entered,
	// so its commit comes after the other copy's snapshot.
	handler := func(topic string) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			tx, _ := pgtx.TxFromContext(msg.Context())
			if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+pgtx.QualifiedName(schema, "effects")+` VALUES ($1)`, msg.UUID); err != nil {
				return err
			}
			select {
			case <-entered[other[topic]]:
				return nil
			case <-msg.Context().Done():
				return msg.Context().Err()
			}
		}
	}

	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	for _, tp := range []string{topic, redrive} {
		sub, err := b.NewSubscriber("rewards")
		require.NoError(t, err)
		r.AddConsumerHandler("rewards-"+tp, tp, sub, handler(tp)).AddMiddleware(observe(tp), mw.Middleware)
	}
	// Both copies are committed before either subscription reads: a copy inserted after the
	// winner's claim would be hidden from its subscription until the winner commits (rows show
	// only below the server's xmin), and the winner waits for it. Subscriptions are woken by
	// inserts at once, so publishing while the router runs could produce exactly that.
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("e-7", []byte(`{}`))))
	require.NoError(t, pub.Publish(redrive, message.NewMessage("e-7", []byte(`{}`))))

	go func() { _ = r.Run(ctx) }()
	<-r.Running()
	t.Cleanup(func() { _ = r.Close() })

	acked := map[string]bool{}
	var nacks []outcome
	for len(acked) < 2 {
		select {
		case o := <-outcomes:
			if o.err == nil {
				acked[o.topic] = true
			} else {
				nacks = append(nacks, o)
			}
		case <-ctx.Done():
			t.Fatalf("both copies not settled: acked %v, %d nacks", acked, len(nacks))
		}
	}
	if len(nacks) > 0 {
		t.Fatalf("the losing copy was nacked %d times (first: %v); it must be settled at once as a duplicate", len(nacks), nacks[0].err)
	}
	require.Equal(t, once.Counters{Fresh: 1, Duplicates: 1}, mw.Counters().Consumer("rewards"))
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "effects")))
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")))
}

// watermill-sql stores metadata as JSON, which used to turn "abc\xff" into "abc\uFFFD" on the
// way to the subscriber. The SQL broker's publisher refuses it instead of altering it.
func TestSQLPublisherRefusesMetadataItWouldAlter(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, testSQLPublisherRefusesMetadataItWouldAlter)
}

func testSQLPublisherRefusesMetadataItWouldAlter(t *testing.T, version int) {
	topic := pgtest.NewName("meta")
	b := newBrokerWith(t, broker.SQL, func(c *broker.Config) { c.SQL.WatermillSQL = version }, broker.Subscription{Topic: topic, Group: "g"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	bad := message.NewMessage("m-1", []byte("p"))
	bad.Metadata.Set("note", "abc\xff")
	require.ErrorContains(t, pub.Publish(topic, bad), "must be valid UTF-8")

	good := message.NewMessage("m-2", []byte("p"))
	good.Metadata.Set("note", "naïve ☃")
	require.NoError(t, pub.Publish(topic, good))
	sub, err := b.NewSubscriber("g")
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	got := receive(t, ch, 1, 20*time.Second)
	require.Equal(t, "m-2", got[0].UUID, "the refused message was not stored")
	require.Equal(t, "naïve ☃", got[0].Metadata.Get("note"))
}

// A serialization failure of a handler in the subscriber's transaction dooms that transaction
// (retrying under its snapshot cannot succeed); the later messages of the same batch must not
// run in it either. All are redelivered in a new transaction and applied once, without waiting
// for AckDeadline.
func TestSQLSerializationFailureRedeliversTheWholeBatch(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, testSQLSerializationFailureRedeliversTheWholeBatch)
}

func testSQLSerializationFailureRedeliversTheWholeBatch(t *testing.T, version int) {
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	topic := pgtest.NewName("payments")
	cfg := sqlConfig(t, schema, version)
	cfg.SQL.BatchSize = 10
	cfg.SQL.AckDeadline = 30 * time.Second // the test would time out if it were waited for
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "rewards"}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := broker.New(ctx, db, cfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	balances := pgtx.QualifiedName(schema, "balances")
	pgtest.Exec(t, db, `CREATE TABLE `+balances+` (id text PRIMARY KEY, n int NOT NULL)`)
	pgtest.Exec(t, db, `INSERT INTO `+balances+` VALUES ('m-0', 0), ('m-1', 0), ('m-2', 0)`)
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "rewards"}, watermill.NopLogger{})
	require.NoError(t, err)

	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	// One batch must hold all three. One Publish is one INSERT: the rows share a transaction id,
	// so they become readable together (watermill-sql reads only rows older than every running
	// transaction, and other tests keep transactions open).
	require.NoError(t, pub.Publish(topic, message.NewMessage("m-0", []byte(`{}`)),
		message.NewMessage("m-1", []byte(`{}`)), message.NewMessage("m-2", []byte(`{}`))))
	b.TestSignals().SQLBatchCommit.Init()
	var mu sync.Mutex
	runs := map[string]int{}
	done := make(chan struct{}, 10)
	handler := func(msg *message.Message) error {
		mu.Lock()
		runs[msg.UUID]++
		first := msg.UUID == "m-0" && runs[msg.UUID] == 1
		mu.Unlock()
		if first { // change the row after the subscriber's snapshot
			if _, err := db.Exec(`UPDATE ` + balances + ` SET n = n + 100 WHERE id = 'm-0'`); err != nil {
				return err
			}
		}
		tx, _ := pgtx.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), `UPDATE `+balances+` SET n = n + 1 WHERE id = $1`, msg.UUID)
		if err == nil {
			done <- struct{}{}
		}
		return err
	}
	sub, err := b.NewSubscriber("rewards")
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddConsumerHandler("rewards", topic, sub, handler).AddMiddleware(mw.Middleware)
	go func() { _ = r.Run(ctx) }()
	<-r.Running()
	t.Cleanup(func() { _ = r.Close() })

	for range 3 {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("the batch was not applied in a new transaction")
		}
	}
	// The handlers are done; the subscriber commits right after its ack. Wait for that commit
	// (the doomed transaction's COMMIT came first, and failed).
	offsets := pgtx.QualifiedName(schema, "watermill_offsets_"+topic)
	b.TestSignals().SQLBatchCommit.WaitFor(func(string) bool {
		return pgtest.Count(t, db, `SELECT coalesce(max(offset_acked), 0) FROM `+offsets) >= 3
	})
	require.NoError(t, r.Close())
	mu.Lock()
	require.Equal(t, map[string]int{"m-0": 2, "m-1": 1, "m-2": 1}, runs, "later messages never ran in the doomed transaction")
	mu.Unlock()
	require.Equal(t, 101, pgtest.Count(t, db, `SELECT n FROM `+balances+` WHERE id = 'm-0'`))
	require.Equal(t, 2, pgtest.Count(t, db, `SELECT sum(n) - 101 FROM `+balances))
	require.Equal(t, 3, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")))
	require.Equal(t, once.Counters{Fresh: 3, Failed: 1, TxRetries: 3}, mw.Counters().Consumer("rewards"))
}

// TestSQLHandlerWritesThroughWatermillSQLsOwnTx: a handler on the SQL broker's subscriber that
// writes through its watermill-sql version's own TxFromContext (as Watermill's examples do)
// writes in the transaction the effectively-once middleware works in: an attempt that fails
// after its write leaves nothing (its savepoint is rolled back), the redelivery in the same
// transaction applies it once, and the claim and the effect commit with the group's offset.
func TestSQLHandlerWritesThroughWatermillSQLsOwnTx(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, testSQLHandlerWritesThroughWatermillSQLsOwnTx)
}

func testSQLHandlerWritesThroughWatermillSQLsOwnTx(t *testing.T, version int) {
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	topic := pgtest.NewName("payments")
	cfg := sqlConfig(t, schema, version)
	cfg.SQL.NackDelay = 10 * time.Millisecond
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "rewards"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.New(ctx, db, cfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	b.TestSignals().SQLBatchCommit.Init()
	effects := pgtx.QualifiedName(schema, "effects")
	pgtest.Exec(t, db, `CREATE TABLE `+effects+` (key text NOT NULL)`)
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "rewards"}, watermill.NopLogger{})
	require.NoError(t, err)

	// The handler's own view of the subscriber's transaction, as its watermill-sql version
	// gives it, and the *sql.Tx underneath.
	subscriberTx := func(ctx context.Context) (exec func(query string, args ...any) error, tx *sql.Tx, ok bool) {
		switch version {
		case 3:
			tx, ok := wsql.TxFromContext(ctx)
			return func(q string, args ...any) error { _, err := tx.ExecContext(ctx, q, args...); return err }, tx, ok
		default:
			wtx, ok := wsql4.TxFromContext(ctx)
			std, _ := wtx.(*wsql4.StdSQLTx)
			if !ok || std == nil {
				return nil, nil, false
			}
			return func(q string, args ...any) error { _, err := wtx.ExecContext(ctx, q, args...); return err }, std.Tx, true
		}
	}
	attempts := 0
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		attempts++
		exec, tx, ok := subscriberTx(msg.Context())
		if !ok {
			return nil, errors.New("no watermill-sql transaction in the message context")
		}
		if mwTx, _ := pgtx.TxFromContext(msg.Context()); mwTx != tx {
			return nil, errors.New("the middleware's transaction is not the subscriber's")
		}
		if err := exec(`INSERT INTO `+effects+` VALUES ($1)`, msg.UUID); err != nil {
			return nil, err
		}
		if attempts == 1 {
			return nil, errors.New("fails after its write")
		}
		return nil, nil
	})

	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("e-1", []byte(`{}`))))
	sub, err := b.NewSubscriber("rewards")
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	m := testwait.Receive(t, ch, "the message")
	_, err = h(m)
	require.ErrorContains(t, err, "fails after its write")
	m.Nack()
	m = testwait.Receive(t, ch, "the message again, in the same transaction")
	_, err = h(m)
	require.NoError(t, err)
	m.Ack()
	b.TestSignals().SQLBatchCommit.WaitFor(func(string) bool { // the subscriber commits right after the ack
		return pgtest.Count(t, db, `SELECT coalesce(max(offset_acked), 0) FROM `+pgtx.QualifiedName(schema, "watermill_offsets_"+topic)) >= 1
	})
	require.Equal(t, 2, attempts)
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+effects), "the failed attempt's write was rolled back")
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")))
	require.Equal(t, once.Counters{Fresh: 1, Failed: 1}, mw.Counters().Consumer("rewards"))
}
