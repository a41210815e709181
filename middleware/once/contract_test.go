package once_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql4 "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// txPath is one of the three ways the middleware runs a handler: in a transaction of its own,
// in a group-commit transaction shared with other messages, or in the transaction of
// watermill-sql's subscriber. The contract (onceContract) must hold on each of them, and on the
// default Config (group commit with Linger 0: alone when a lane is free, grouped when not).
type txPath struct {
	name string
	// config adjusts a test's Config for the path.
	config func(*once.Config)
	// subscriberTx delivers every message inside a real watermill-sql subscriber transaction.
	subscriberTx bool
	// sql is the watermill-sql major version of that subscriber: 3 (default) or 4.
	sql int
	// batch runs each case's handler as a once.BatchHandler doing the same business write
	// (handler, pathEnv.apply): the batch path makes the same promises.
	batch bool
}

var txPaths = withBatchPaths([]txPath{
	{name: "default", config: func(*once.Config) {}},
	{name: "own-tx", config: func(c *once.Config) { c.GroupCommit.Disabled = true }},
	{name: "group-commit", config: func(c *once.Config) {
		c.GroupCommit = once.GroupCommitConfig{Workers: 2, TxBatchSize: 50, Linger: 2 * time.Millisecond}
	}},
	{name: "subscriber-tx", config: func(*once.Config) {}, subscriberTx: true, sql: 3},
	{name: "subscriber-tx-v4", config: func(*once.Config) {}, subscriberTx: true, sql: 4},
})

// withBatchPaths adds to each path its "-batch" twin, whose handlers are batch handlers.
func withBatchPaths(paths []txPath) []txPath {
	for _, p := range paths {
		if !p.batch {
			p.name, p.batch = p.name+"-batch", true
			paths = append(paths, p)
		}
	}
	return paths
}

// handler returns h, or on a batch path a batch handler applying its messages through h one
// by one, in the batch's transaction (each message's context carries it): the same writes,
// outputs and errors, a failed message named in a *once.BatchError so that it fails alone
// (a serialization failure or deadlock fails the batch as a whole, as its statement would).
func (p txPath) handler(h message.HandlerFunc) message.HandlerFunc {
	if !p.batch {
		return h
	}
	return once.BatchHandler(func(_ context.Context, _ *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		var all []*message.Message
		for _, m := range msgs {
			out, err := h(m)
			if pgtx.IsRetryableTx(err) {
				return nil, err // the transaction is lost for every message: the batch runs again
			}
			if err != nil {
				return nil, &once.BatchError{Failed: map[*message.Message]error{m: err}}
			}
			all = append(all, out...)
		}
		return all, nil
	})
}

// apply is the path's handler for the plain effect: env.effect, or on a batch path one
// multi-row INSERT for the batch.
func (e *pathEnv) apply() message.HandlerFunc {
	if !e.path.batch {
		return e.effect
	}
	return once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		keys := make([]string, len(msgs))
		for i, m := range msgs {
			keys[i] = m.UUID
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO `+e.table("effects")+` (key, amount) SELECT unnest($1::text[]), 1`, keys)
		return nil, err
	})
}

// TestContract runs the middleware's contract on every transaction path, with per-message
// handlers and (the "-batch" paths) batch handlers. Every case applies to both. On the batch
// paths a message run alone, and every message in watermill-sql's subscriber transaction, is
// a batch of one; messages in flight together form a batch of several on the group-commit
// paths (the poison among messages in flight: a batch of eight, then of seven without it).
// Kafka and RabbitMQ deliveries
// reach these same paths; the e2e suite runs a batch consumer on each of them.
func TestContract(t *testing.T) {
	t.Parallel()
	for _, p := range txPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			onceContract(t, p)
		})
	}
}

// pathEnv is an env whose deliveries take path p.
type pathEnv struct {
	*env
	path    txPath
	subDB   *sql.DB
	offsets *offsetWatch // the subscriber path's offset commits
	seq     atomic.Int64
}

func newPathEnv(t *testing.T, p txPath, cfg once.Config, adjust ...func(*once.Config)) *pathEnv {
	t.Helper()
	p.config(&cfg)
	for _, f := range adjust {
		f(&cfg)
	}
	e := &pathEnv{env: newEnv(t, cfg), path: p}
	t.Cleanup(func() { _ = e.mw.Close() })
	if p.subscriberTx {
		e.subDB = pgtest.OpenDB(t, 40)
		e.offsets = watchOffsets(t, e.subDB, e.schema)
	}
	return e
}

// other returns a second middleware on the same schema and path.
func (e *pathEnv) other(t *testing.T, cfg once.Config) *once.Middleware {
	t.Helper()
	e.path.config(&cfg)
	cfg.Schema = e.schema
	mw, err := once.New(e.db, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mw.Close() })
	return mw
}

// send hands msg to h as the path's subscriber would and returns what the router would see
// (nil: ack). On the subscriber path msg runs in the transaction of a real watermill-sql
// subscriber, which has committed (or rolled back) when send returns.
func (e *pathEnv) send(h message.HandlerFunc, msg *message.Message) error {
	run, err := e.prepare(h, msg)
	if err != nil {
		return err
	}
	return run()
}

// prepare does what must precede a concurrent delivery and returns the delivery. On the
// subscriber path it publishes the carrier: watermill-sql delivers only rows older than every
// open transaction, so a carrier published after another delivery's transaction began stays
// invisible until that transaction ends. Tests whose deliveries wait for each other (a barrier,
// a row lock) prepare them all first.
func (e *pathEnv) prepare(h message.HandlerFunc, msg *message.Message) (func() error, error) {
	if !e.path.subscriberTx {
		return func() error { _, err := h(msg); return err }, nil
	}
	topic, err := e.publishCarrier()
	if err != nil {
		return nil, err
	}
	return func() error { return e.inSubscriberTx(topic, h, msg) }, nil
}

// prepareAll prepares a delivery of each message, failing t if one cannot be prepared.
func (e *pathEnv) prepareAll(t *testing.T, h message.HandlerFunc, msgs ...*message.Message) []func() error {
	t.Helper()
	runs := make([]func() error, len(msgs))
	for i, m := range msgs {
		run, err := e.prepare(h, m)
		require.NoError(t, err)
		runs[i] = run
	}
	return runs
}

func (e *pathEnv) deliver(h message.HandlerFunc, uuid, payload string) error {
	return e.send(h, message.NewMessage(uuid, []byte(payload)))
}

// publishCarrier publishes a carrier message to a topic of its own and returns the topic.
func (e *pathEnv) publishCarrier() (string, error) {
	topic := fmt.Sprintf("d_%d", e.seq.Add(1))
	pub, err := newSQLPublisher(e.path.sql, e.subDB, e.schema)
	if err != nil {
		return "", err
	}
	if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err != nil {
		return "", fmt.Errorf("publish carrier: %w", err)
	}
	return topic, nil
}

// inSubscriberTx receives topic's carrier from a watermill-sql subscriber and runs h on msg
// inside the carrier's transaction, then acks or nacks the carrier and closes the subscriber,
// which ends the transaction. msg itself is not published, so any key (even one no table could
// store) reaches the middleware as sent. When the subscriber's commit failed (the middleware
// doomed the transaction), the carrier is delivered again in a new transaction, as the
// subscriber would.
func (e *pathEnv) inSubscriberTx(topic string, h message.HandlerFunc, msg *message.Message) error {
	sub, err := newSQLSubscriber(e.path.sql, e.subDB, e.schema, "suite")
	if err != nil {
		return err
	}
	defer func() { _ = sub.Close() }() // waits for the subscriber's transaction to end
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		return err
	}
	acked, err := e.offsets.watch(topic, "suite") // the subscriber has created the offsets table
	if err != nil {
		return err
	}
	receive := func() (*message.Message, error) {
		select {
		case c := <-ch:
			return c, nil
		case <-time.After(testwait.Timeout):
			return nil, errors.New("the subscriber delivered no carrier")
		}
	}
	carrier, err := receive()
	if err != nil {
		return err
	}
	for i := range 5 {
		if i > 0 {
			// The subscriber delivers a new message in each transaction, and the router acks or
			// nacks it: the middleware may look at how an earlier copy ended.
			msg = msg.Copy()
		}
		if !hasSubscriberTx(e.path.sql, carrier.Context()) {
			return errors.New("the carrier came without the subscriber's transaction")
		}
		msg.SetContext(carrier.Context())
		if _, herr := h(msg); herr != nil {
			msg.Nack()
			carrier.Nack()
			return herr
		}
		msg.Ack()
		carrier.Ack()
		// Either the subscriber commits the offset, or its commit fails and it delivers the
		// carrier again, in a new transaction.
		next, err := committedOrRedelivered(ch, acked)
		if err != nil || next == nil {
			return err
		}
		carrier = next
	}
	return errors.New("the subscriber's transaction never committed")
}

// hasSubscriberTx reports whether ctx holds the transaction of a watermill-sql subscriber of
// major version v, as that version itself reads it.
func hasSubscriberTx(v int, ctx context.Context) bool {
	if v == 4 {
		_, ok := wsql4.TxFromContext(ctx)
		return ok
	}
	_, ok := wsql.TxFromContext(ctx)
	return ok
}

// committedOrRedelivered waits until the subscriber has committed the carrier's offset (nil) or
// has delivered the carrier again (the redelivery).
func committedOrRedelivered(ch <-chan *message.Message, acked <-chan int64) (*message.Message, error) {
	select {
	case c := <-ch:
		return c, nil
	case <-acked:
		return nil, nil
	case <-time.After(testwait.Timeout):
		return nil, errors.New("the subscriber neither committed nor delivered the carrier again")
	}
}

func sqlAdapters(schema string) (wsql.DefaultPostgreSQLSchema, wsql.DefaultPostgreSQLOffsetsAdapter) {
	return wsql.DefaultPostgreSQLSchema{
			GenerateMessagesTableName: func(topic string) string { return pgtx.QualifiedName(schema, "watermill_"+topic) },
			SubscribeBatchSize:        1,
		}, wsql.DefaultPostgreSQLOffsetsAdapter{
			GenerateMessagesOffsetsTableName: func(topic string) string {
				return pgtx.QualifiedName(schema, "watermill_offsets_"+topic)
			},
		}
}

// sqlAdaptersV4 are sqlAdapters for watermill-sql v4: the same tables.
func sqlAdaptersV4(schema string) (wsql4.DefaultPostgreSQLSchema, wsql4.DefaultPostgreSQLOffsetsAdapter) {
	return wsql4.DefaultPostgreSQLSchema{
			GenerateMessagesTableName: func(topic string) string { return pgtx.QualifiedName(schema, "watermill_"+topic) },
			SubscribeBatchSize:        1,
		}, wsql4.DefaultPostgreSQLOffsetsAdapter{
			GenerateMessagesOffsetsTableName: func(topic string) string {
				return pgtx.QualifiedName(schema, "watermill_offsets_"+topic)
			},
		}
}

// newSQLPublisher returns a watermill-sql publisher of major version v (3 or 4) on db.
func newSQLPublisher(v int, db *sql.DB, schema string) (message.Publisher, error) {
	if v == 4 {
		s, _ := sqlAdaptersV4(schema)
		return wsql4.NewPublisher(wsql4.BeginnerFromStdSQL(db), wsql4.PublisherConfig{SchemaAdapter: s, AutoInitializeSchema: true}, watermill.NopLogger{})
	}
	s, _ := sqlAdapters(schema)
	return wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: s, AutoInitializeSchema: true}, watermill.NopLogger{})
}

// newSQLSubscriber returns a watermill-sql subscriber of major version v (3 or 4) on db.
func newSQLSubscriber(v int, db *sql.DB, schema, group string) (message.Subscriber, error) {
	if v == 4 {
		s, o := sqlAdaptersV4(schema)
		return wsql4.NewSubscriber(wsql4.BeginnerFromStdSQL(db), wsql4.SubscriberConfig{
			ConsumerGroup:    group,
			SchemaAdapter:    s,
			OffsetsAdapter:   o,
			InitializeSchema: true,
			PollInterval:     10 * time.Millisecond,
			ResendInterval:   10 * time.Millisecond,
		}, watermill.NopLogger{})
	}
	s, o := sqlAdapters(schema)
	return wsql.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup:    group,
		SchemaAdapter:    s,
		OffsetsAdapter:   o,
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
		ResendInterval:   10 * time.Millisecond,
	}, watermill.NopLogger{})
}

// onceContract is the middleware's contract, run on path p: what every path must guarantee.
func onceContract(t *testing.T, p txPath) {
	t.Run("replays apply once", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "rewards"})
		h := e.mw.Middleware(e.apply())
		for range 5 {
			require.NoError(t, e.deliver(h, "e-91", `{"amount":120000}`), "every copy is acked")
		}
		require.Equal(t, 1, e.effects(t))
		require.Equal(t, 1, e.claims(t))
		require.Equal(t, once.Counters{Fresh: 1, Duplicates: 4}, e.mw.Counters().Consumer("rewards"))
		require.NoError(t, e.deliver(h, "e-92", `{"amount":5}`))
		require.Equal(t, 2, e.effects(t), "a new id is a new effect")
	})

	t.Run("consumers are scoped apart", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "rewards"})
		other := e.other(t, once.Config{Consumer: "notifications"})
		rewards, notifications := e.mw.Middleware(e.apply()), other.Middleware(e.apply())
		require.NoError(t, e.deliver(rewards, "e-1", "x"))
		require.NoError(t, e.deliver(notifications, "e-1", "x"))
		require.NoError(t, e.deliver(rewards, "e-1", "x"))
		require.Equal(t, 2, e.effects(t), "each consumer applies the event once")
		require.Equal(t, uint64(1), e.mw.Counters().Consumer("rewards").Duplicates)
	})

	t.Run("concurrent copies apply exactly once", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "rewards"})
		// The winner holds its row lock while it "works", so the others really wait on the key:
		// the sleep is the slow handler under test.
		h := e.mw.Middleware(p.handler(func(msg *message.Message) ([]*message.Message, error) {
			time.Sleep(50 * time.Millisecond)
			return e.effect(msg)
		}))
		const copies = 16
		var msgs []*message.Message
		for range copies {
			msgs = append(msgs, message.NewMessage("same-id", []byte("payload")))
		}
		runs := e.prepareAll(t, h, msgs...)
		errs := make([]error, copies)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, run := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = run()
			}()
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err, "every copy is acked, none errors")
		}
		require.Equal(t, 1, e.effects(t))
		require.Equal(t, 1, e.claims(t))
		c := e.mw.Counters().Consumer("rewards")
		require.Equal(t, uint64(1), c.Fresh)
		require.Equal(t, uint64(copies-1), c.Duplicates)
	})

	t.Run("a failed handler leaves no claim and none of its writes", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "rewards"})
		var calls atomic.Int32
		h := e.mw.Middleware(p.handler(func(msg *message.Message) ([]*message.Message, error) {
			if _, err := e.effect(msg); err != nil {
				return nil, err
			}
			if calls.Add(1) == 1 {
				return nil, errors.New("downstream hiccup")
			}
			return nil, nil
		}))
		require.ErrorContains(t, e.deliver(h, "e-1", "p"), "downstream hiccup")
		require.Zero(t, e.claims(t), "a failed handler leaves no dedupe row")
		require.Zero(t, e.effects(t), "and none of its writes")
		require.NoError(t, e.deliver(h, "e-1", "p"), "the redelivery applies it")
		require.NoError(t, e.deliver(h, "e-1", "p"))
		require.Equal(t, 1, e.effects(t))
		require.Equal(t, 1, e.claims(t))
	})

	t.Run("a panic rolls back", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "rewards"})
		h := e.mw.Middleware(p.handler(func(msg *message.Message) ([]*message.Message, error) {
			_, _ = e.effect(msg)
			panic("boom")
		}))
		err := e.deliver(h, "e-1", "p")
		require.True(t, wmonce.IsPanic(err), "got %v", err)
		require.Zero(t, e.claims(t))
		require.Zero(t, e.effects(t))
	})

	t.Run("a duplicate with another payload is reported, or refused when strict", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "rewards"})
		h := e.mw.Middleware(e.apply())
		require.NoError(t, e.deliver(h, "e-1", `{"amount":1}`))
		require.NoError(t, e.deliver(h, "e-1", `{"amount":1}`))
		require.NoError(t, e.deliver(h, "e-1", `{"amount":999}`), "acked by default, but reported")
		c := e.mw.Counters().Consumer("rewards")
		require.Equal(t, uint64(2), c.Duplicates)
		require.Equal(t, uint64(1), c.FingerprintMismatches)
		require.Equal(t, 1, e.effects(t))

		strict := newPathEnv(t, p, once.Config{Consumer: "rewards", RejectFingerprintMismatch: true})
		hs := strict.mw.Middleware(strict.apply())
		require.NoError(t, strict.deliver(hs, "e-1", `{"amount":1}`))
		err := strict.deliver(hs, "e-1", `{"amount":999}`)
		require.True(t, wmonce.IsPermanent(err), "refused as permanent so the stack parks it: %v", err)
		require.ErrorContains(t, err, "fingerprint mismatch")
		require.Equal(t, 1, strict.effects(t))
	})

	t.Run("key from metadata", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c", Key: wmonce.KeyFromMetadata("event_id")})
		h := e.mw.Middleware(e.apply())
		for i := range 3 {
			msg := message.NewMessage(fmt.Sprintf("transport-%d", i), []byte("p")) // new transport id each time
			msg.Metadata.Set("event_id", "evt-1")
			require.NoError(t, e.send(h, msg))
		}
		require.Equal(t, 1, e.effects(t))
		err := e.send(h, message.NewMessage("x", []byte("p")))
		require.ErrorIs(t, err, wmonce.ErrInvalidKey)
		require.ErrorContains(t, err, `metadata field "event_id" is missing`)
		require.True(t, wmonce.IsPermanent(err))
	})

	t.Run("key from payload sha256", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c", Key: wmonce.KeyFromPayloadSHA256()})
		h := e.mw.Middleware(e.apply())
		for i := range 3 {
			require.NoError(t, e.deliver(h, fmt.Sprintf("t-%d", i), `{"same":"bytes"}`))
		}
		require.NoError(t, e.deliver(h, "t-9", `{"other":"bytes"}`))
		require.Equal(t, 2, e.effects(t))
		var key string
		require.NoError(t, e.db.QueryRow(`SELECT message_id FROM `+e.table("processed_messages")+` ORDER BY processed_at LIMIT 1`).Scan(&key))
		require.Len(t, key, 64)
	})

	t.Run("business key", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c", Key: wmonce.KeyFromFunc(func(m *message.Message) (string, error) {
			return "payment:" + string(m.Payload), nil
		})})
		h := e.mw.Middleware(e.apply())
		require.NoError(t, e.deliver(h, "a", "pay_42"))
		require.NoError(t, e.deliver(h, "b", "pay_42"))
		require.Equal(t, 1, e.effects(t))
	})

	t.Run("empty, over-long and unstorable keys are refused, not applied", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c", MaxKeyLength: 10})
		h := e.mw.Middleware(e.apply())
		err := e.deliver(h, "", "p")
		require.ErrorIs(t, err, wmonce.ErrInvalidKey)
		require.ErrorContains(t, err, "UUID is empty")
		err = e.deliver(h, "0123456789abc", "p")
		require.ErrorIs(t, err, wmonce.ErrInvalidKey)
		require.ErrorContains(t, err, "raise MaxKeyLength")
		require.ErrorIs(t, e.deliver(h, "bad\x00key", "p"), wmonce.ErrInvalidKey)
		require.Zero(t, e.effects(t))
		require.Zero(t, e.claims(t))
		require.Equal(t, uint64(3), e.mw.Counters().Consumer("c").Refused)
	})

	t.Run("no consumer name", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{})
		require.ErrorIs(t, e.deliver(e.mw.Middleware(e.apply()), "a", "p"), once.ErrNoConsumer)
		require.Zero(t, e.effects(t))
	})

	t.Run("outputs reach the outbox only on commit", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "rewards", OutputTopic: "cashback"})
		var fail atomic.Bool
		fail.Store(true)
		h := e.mw.Middleware(p.handler(func(msg *message.Message) ([]*message.Message, error) {
			out := message.NewMessage("out-"+msg.UUID, []byte(`{"paise":2400}`))
			if fail.Load() {
				return []*message.Message{out}, errors.New("fails after producing")
			}
			return []*message.Message{out}, nil
		}))
		require.Error(t, e.deliver(h, "e-91", "p"))
		require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))

		fail.Store(false)
		in := message.NewMessage("e-91", []byte("p"))
		in.Metadata.Set("correlation_id", "corr-7")
		require.NoError(t, e.send(h, in))
		require.NoError(t, e.deliver(h, "e-91", "p"))
		require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))

		// The relay forwards it with its UUID, metadata and the stamped causation/correlation ids.
		target := newCapture()
		relay, err := outbox.NewRelay(e.db, target, outbox.RelayConfig{Schema: e.schema, PollInterval: 10 * time.Millisecond}, nil)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = relay.Run(ctx) }()
		t.Cleanup(func() { _ = relay.Close() })
		// A row becomes readable once every older transaction on the server has ended; parallel
		// tests keep some open, and the relay polls until it is.
		testwait.Receive(t, target.published, "the relay to forward the output")
		got := target.all()
		require.Len(t, got, 1)
		require.Equal(t, "cashback", got[0].topic)
		require.Equal(t, "out-e-91", got[0].msg.UUID)
		require.Equal(t, "e-91", got[0].msg.Metadata.Get(outbox.MetadataCausationID))
		require.Equal(t, "corr-7", got[0].msg.Metadata.Get(outbox.MetadataCorrelationID))
		require.NotEmpty(t, got[0].msg.Metadata.Get(outbox.MetadataOccurredAt))
		require.JSONEq(t, `{"paise":2400}`, string(got[0].msg.Payload))
	})

	t.Run("outputs without a topic are permanent errors", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c"})
		h := e.mw.Middleware(p.handler(func(msg *message.Message) ([]*message.Message, error) {
			_, _ = e.effect(msg)
			return []*message.Message{message.NewMessage("o", nil)}, nil
		}))
		err := e.deliver(h, "e-1", "p")
		require.ErrorIs(t, err, wmonce.ErrOutputWithoutTopic)
		require.True(t, wmonce.IsPermanent(err))
		require.Zero(t, e.effects(t), "rolled back")
		require.Zero(t, e.claims(t))
	})

	t.Run("the outbox publisher joins the transaction", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c"})
		w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
		require.NoError(t, err)
		pub := w.Publisher()
		var fail atomic.Bool
		fail.Store(true)
		h := e.mw.Middleware(p.handler(func(msg *message.Message) ([]*message.Message, error) {
			out := message.NewMessage("sms-"+msg.UUID, []byte("hi"))
			out.SetContext(msg.Context())
			if err := pub.Publish("sms", out); err != nil {
				return nil, err
			}
			if fail.Load() {
				return nil, errors.New("after publish")
			}
			return nil, nil
		}))
		require.Error(t, e.deliver(h, "e-1", "p"))
		require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")), "a rolled-back publish leaves nothing")
		fail.Store(false)
		require.NoError(t, e.deliver(h, "e-1", "p"))
		require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))
		// Without a transaction in the context the publisher refuses instead of sending around it.
		require.ErrorIs(t, pub.Publish("sms", message.NewMessage("x", nil)), pgtx.ErrNoTransaction)
	})

	t.Run("the stack retries transient errors in fresh attempts", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c"})
		stack, err := once.Stack(once.StackConfig{
			Middleware: e.mw,
			Retry:      wmiddleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond},
		})
		require.NoError(t, err)
		var calls atomic.Int32
		h := compose(stack, p.handler(func(msg *message.Message) ([]*message.Message, error) {
			if _, err := e.effect(msg); err != nil {
				return nil, err
			}
			if calls.Add(1) < 3 {
				return nil, errors.New("transient")
			}
			return nil, nil
		}))
		require.NoError(t, e.deliver(h, "e-1", "p"))
		require.Equal(t, int32(3), calls.Load())
		require.Equal(t, 1, e.effects(t), "the two failed attempts were rolled back")
		require.Equal(t, 1, e.claims(t))
	})

	t.Run("the stack parks permanent failures and bad keys", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c"})
		w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
		require.NoError(t, err)
		stack, err := once.Stack(once.StackConfig{
			Middleware:      e.mw,
			Retry:           wmiddleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond},
			PoisonPublisher: w.ParkingPublisher(e.db),
			PoisonTopic:     "poison",
		})
		require.NoError(t, err)
		var calls atomic.Int32
		h := compose(stack, p.handler(func(msg *message.Message) ([]*message.Message, error) {
			calls.Add(1)
			var v struct{ Amount int }
			if err := json.Unmarshal(msg.Payload, &v); err != nil {
				_, _ = e.effect(msg) // a write that must not survive
				return nil, wmonce.Permanent(err)
			}
			return e.effect(msg)
		}))
		parked := func() int {
			return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE payload->>'destination_topic' = 'poison'`)
		}
		require.NoError(t, e.deliver(h, "bad", "not json"), "parked and acked: it no longer blocks the queue")
		require.Equal(t, int32(1), calls.Load(), "permanent errors are not retried")
		require.NoError(t, e.deliver(h, "good", `{"Amount":1}`))
		require.Equal(t, 1, e.effects(t), "only the good message applied")
		var reason string
		require.NoError(t, e.db.QueryRow(`SELECT metadata->>'reason_poisoned' FROM `+e.table("outbox")+` WHERE uuid = 'bad'`).Scan(&reason))
		require.Contains(t, reason, "permanent")
		require.Equal(t, 1, parked())

		// A message with an unusable key is parked the same way, never applied.
		require.NoError(t, e.deliver(h, "", `{"Amount":1}`))
		require.Equal(t, 2, parked())
		require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE metadata->>'uuid_missing' = 'true'`))
		require.Equal(t, 1, e.effects(t))
		require.Equal(t, 1, e.claims(t))
	})

	t.Run("a poison among messages in flight is parked alone", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c"})
		w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
		require.NoError(t, err)
		stack, err := once.Stack(once.StackConfig{
			Middleware:      e.mw,
			Retry:           wmiddleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond},
			PoisonPublisher: w.ParkingPublisher(e.db),
			PoisonTopic:     "poison",
		})
		require.NoError(t, err)
		// Delivered at once, so that on the group-commit paths they share transactions (and on
		// the batch paths a batch, which a poison fails as a whole).
		h := compose(stack, p.handler(func(msg *message.Message) ([]*message.Message, error) {
			if _, err := e.effect(msg); err != nil {
				return nil, err
			}
			if msg.UUID == "m-5" {
				return nil, wmonce.Permanent(errors.New("poison"))
			}
			return nil, nil
		}))
		var msgs []*message.Message
		for i := range 8 {
			msgs = append(msgs, message.NewMessage(fmt.Sprintf("m-%d", i), []byte("p")))
		}
		runs := e.prepareAll(t, h, msgs...)
		errs := make([]error, len(runs))
		var wg sync.WaitGroup
		for i, run := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = run()
			}()
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "m-%d: acked, the poison once parked", i)
		}
		require.Equal(t, 7, e.effects(t), "every good message once, nothing of the poison")
		require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE key = 'm-5'`))
		require.Equal(t, 7, e.claims(t))
		require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE payload->>'destination_topic' = 'poison'`))
		require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE uuid = 'm-5'`))
	})

	t.Run("the age guard refuses old fresh copies only", func(t *testing.T) {
		t.Parallel()
		now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
		e := newPathEnv(t, p, once.Config{Consumer: "c", MaxMessageAge: 24 * time.Hour, Now: func() time.Time { return now }})
		h := e.mw.Middleware(e.apply())

		// Applied while young; a late copy of it is an ordinary duplicate, acked.
		err := e.send(h, occurred("e-1", now.Add(-time.Hour), "p"))
		require.NoError(t, err)
		now = now.Add(48 * time.Hour)
		err = e.send(h, occurred("e-1", now.Add(-49*time.Hour), "p"))
		require.NoError(t, err)

		// An old event whose key is unknown may have been applied and forgotten: refused, reported.
		err = e.send(h, occurred("e-2", now.Add(-30*time.Hour), "p"))
		require.ErrorIs(t, err, wmonce.ErrTooOld)
		require.True(t, wmonce.IsPermanent(err))
		require.Equal(t, 1, e.effects(t))
		require.Equal(t, 1, e.claims(t), "the refused copy left no claim")
		c := e.mw.Counters().Consumer("c")
		require.Equal(t, uint64(1), c.TooOld)
		require.Equal(t, uint64(1), c.Duplicates)

		// Without a time the guard cannot judge and lets the message through.
		err = e.send(h, message.NewMessage("e-3", []byte("p")))
		require.NoError(t, err)

		// A time that does not parse is malformed metadata: refused, not guessed.
		bad := message.NewMessage("e-4", []byte("p"))
		bad.Metadata.Set(outbox.MetadataOccurredAt, "yesterday")
		err = e.send(h, bad)
		require.ErrorIs(t, err, wmonce.ErrMalformedMetadata)
		require.True(t, wmonce.IsPermanent(err))
		require.Equal(t, 2, e.effects(t))
	})

	t.Run("occurred_at is read only when the age guard or day partitions need it", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c"})
		// A foreign producer's time in another format: nothing here needs it, so it is no reason
		// to refuse the message (the inbox Receiver follows the same rule).
		m := message.NewMessage("e-1", []byte("p"))
		m.Metadata.Set(outbox.MetadataOccurredAt, "Tue, 01 Dec 2026 10:00:00 GMT")
		require.NoError(t, e.send(e.mw.Middleware(e.apply()), m))
		require.Equal(t, 1, e.effects(t))
		require.Zero(t, e.mw.Counters().Consumer("c").Refused)
	})

	t.Run("counts per sender", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c", SenderMetadataKey: "sender"})
		h := e.mw.Middleware(e.apply())
		send := func(uuid, sender string) {
			msg := message.NewMessage(uuid, []byte("p"))
			msg.Metadata.Set("sender", sender)
			err := e.send(h, msg)
			require.NoError(t, err)
		}
		send("a", "payments")
		send("a", "payments")
		send("a", "redrive-tool")
		send("b", "redrive-tool")
		by := e.mw.Counters().Series
		require.Equal(t, once.Counters{Fresh: 1, Duplicates: 1}, by[once.CounterKey{Consumer: "c", Sender: "payments"}])
		require.Equal(t, once.Counters{Fresh: 1, Duplicates: 1}, by[once.CounterKey{Consumer: "c", Sender: "redrive-tool"}])
		require.Equal(t, once.Counters{Fresh: 2, Duplicates: 2}, e.mw.Counters().Consumer("c"))
	})

	t.Run("claims partitioned by day", func(t *testing.T) {
		t.Parallel()
		e := newPathEnv(t, p, once.Config{Consumer: "c", PartitionByDay: true})
		h := e.mw.Middleware(e.apply())
		day1 := time.Date(2026, 11, 20, 23, 59, 0, 0, time.UTC)
		day2 := day1.Add(2 * time.Minute) // next day

		// Partitions are created on demand; copies meet their original in the same partition.
		// The subscriber's transaction cannot be run again, so there the first message of a day
		// fails once, having created the partition, and its redelivery finds it.
		firstOfDay := func(msg *message.Message) {
			err := e.send(h, msg)
			if p.subscriberTx {
				require.ErrorContains(t, err, "partition of processed_messages_daily is missing")
				err = e.send(h, msg)
			}
			require.NoError(t, err)
		}
		firstOfDay(occurred("e-1", day1, "p"))
		for range 2 {
			require.NoError(t, e.send(h, occurred("e-1", day1, "p")))
		}
		firstOfDay(occurred("e-2", day2, "p"))
		require.Equal(t, 2, e.effects(t))
		require.Equal(t, once.Counters{Fresh: 2, Duplicates: 2}, e.mw.Counters().Consumer("c"), "creating a partition is not a lost race")
		days, err := partition.List(context.Background(), e.db, e.schema)
		require.NoError(t, err)
		require.Equal(t, []time.Time{partition.Day(day1), partition.Day(day2)}, days)
		require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table(partition.Name(day1))))

		// A message without a time cannot be placed: refused, never applied.
		err = e.send(h, message.NewMessage("e-3", []byte("p")))
		require.ErrorIs(t, err, wmonce.ErrMalformedMetadata)
		require.Equal(t, 2, e.effects(t))

		// Retention drops whole days.
		dropped, err := partition.DropBefore(context.Background(), e.db, e.schema, day2)
		require.NoError(t, err)
		require.Equal(t, []time.Time{partition.Day(day1)}, dropped)
		require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table(partition.Parent)))
	})

	t.Run("serialization failures are retried until both effects land", func(t *testing.T) {
		t.Parallel()
		// Two messages grouped in one transaction would run one after the other and could not
		// conflict (and the barrier below would wait forever): one message per group.
		e := newPathEnv(t, p, once.Config{
			Consumer:  "c",
			TxOptions: &sql.TxOptions{Isolation: sql.LevelSerializable},
		}, func(c *once.Config) { c.GroupCommit.TxBatchSize = 1 })
		pgtest.Exec(t, e.db, `CREATE TABLE `+e.table("balance")+` (id int PRIMARY KEY, v int NOT NULL)`)
		pgtest.Exec(t, e.db, `INSERT INTO `+e.table("balance")+` VALUES (1, 0)`)
		// Two handlers read-modify-write the same row at once under SERIALIZABLE: one of them must
		// fail with 40001 and be re-run; both increments land.
		var barrier sync.WaitGroup
		barrier.Add(2)
		var attempts atomic.Int32
		h := e.mw.Middleware(p.handler(func(msg *message.Message) ([]*message.Message, error) {
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
		}))
		// Both deliveries are prepared first: each waits for the other at the barrier.
		runs := e.prepareAll(t, h, message.NewMessage("a", []byte("p")), message.NewMessage("b", []byte("p")))
		errs := make([]error, len(runs))
		var wg sync.WaitGroup
		for i, run := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = run()
			}()
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.Equal(t, 2, pgtest.Count(t, e.db, `SELECT v FROM `+e.table("balance")))
		require.Equal(t, uint64(1), e.mw.Counters().Consumer("c").TxRetries)
	})

	t.Run("a handler that ends its transaction applies nothing and is parked", func(t *testing.T) {
		t.Parallel()
		handlerEndsTxContract(t, p)
	})

	t.Run("a handler that acks or nacks its message settles nothing of the delivery", func(t *testing.T) {
		t.Parallel()
		handlerAcksContract(t, p)
	})
}
