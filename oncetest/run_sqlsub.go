package oncetest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/pgtx"
)

// runSubscriberTx publishes the copies on a watermill-sql topic and consumes them with a real
// watermill-sql v3 subscriber: the middleware runs in the subscriber's transaction (a nack is
// redelivered in the same transaction; the subscriber commits the offset with the effect).
// The subscriber delivers one message at a time, so concurrent schedules run in publish order
// here. The shutdown fault cancels the subscription (what Router.Close does) and subscribes
// again. The run ends when the consumer group's offset has passed every copy.
func (k *Kit) runSubscriberTx(ctx context.Context, h message.HandlerFunc, s schedule, consumer, topic string, in *injector, copies []copyOf, out *outcome) error {
	r := newSQLSubscriberRun(ctx, k.cfg.DB, k.cfg.Schema, consumer, s.fault == FaultReorder, out)
	if err := r.publishCopies(copies); err != nil {
		return err
	}
	chain, mw, err := k.chain(h, ModeSubscriberTx, consumer, topic, in)
	if err != nil {
		return err
	}
	defer func() { _ = mw.Close() }()
	r.chain = chain
	in.shutdown = func(string) { r.shutdown() }
	if err := r.subscribe(); err != nil {
		return err
	}
	defer func() { _ = r.sub.Close() }()
	return r.consume(len(copies))
}

// sqlSubscriberRun is one run through watermill-sql: its publisher, its subscription (replaced
// on a shutdown) and what it counted of each copy.
type sqlSubscriberRun struct {
	ctx      context.Context
	db       *sql.DB
	consumer string // also the topic
	requeue  bool   // FaultReorder: a nacked copy goes to the end of the topic
	out      *outcome
	chain    message.HandlerFunc

	adapter        anyMessageSchema
	offsetsAdapter wsql.DefaultPostgreSQLOffsetsAdapter
	messages       string // the topic's table
	offsets        string // the consumer group's offsets table
	pub            message.Publisher

	mu        sync.Mutex
	cancelSub context.CancelFunc // ends the current subscription
	restarted chan struct{}      // asks for a new subscription
	sub       message.Subscriber
	ch        <-chan *message.Message

	attempts map[string]int
	lastErr  map[string]error
}

func newSQLSubscriberRun(ctx context.Context, db *sql.DB, schema, consumer string, requeue bool, out *outcome) *sqlSubscriberRun {
	table := func(t string) string { return pgtx.QualifiedName(schema, "watermill_"+t) }
	offsets := func(t string) string { return pgtx.QualifiedName(schema, "watermill_offsets_"+t) }
	return &sqlSubscriberRun{
		ctx: ctx, db: db, consumer: consumer, requeue: requeue, out: out,
		adapter: anyMessageSchema{wsql.DefaultPostgreSQLSchema{
			GenerateMessagesTableName: table, SubscribeBatchSize: 1,
			GeneratePayloadType: func(string) string { return "BYTEA" },
		}},
		offsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: offsets},
		messages:       table(consumer),
		offsets:        offsets(consumer),
		restarted:      make(chan struct{}, 2),
		attempts:       map[string]int{},
		lastErr:        map[string]error{},
	}
}

// publishCopies publishes every copy on the run's topic, in order.
func (r *sqlSubscriberRun) publishCopies(copies []copyOf) error {
	pub, err := wsql.NewPublisher(r.db, wsql.PublisherConfig{SchemaAdapter: r.adapter, AutoInitializeSchema: true}, watermill.NopLogger{})
	if err != nil {
		return fmt.Errorf("watermill-sql publisher: %w", err)
	}
	r.pub = pub
	msgs := make([]*message.Message, len(copies))
	for i, c := range copies {
		msgs[i] = c.msg.Copy()
	}
	if err := pub.Publish(r.consumer, msgs...); err != nil {
		return fmt.Errorf("publish the copies on watermill-sql topic %s: %w", r.consumer, err)
	}
	return nil
}

// shutdown is FaultShutdown: it cancels the subscription, as Router.Close does, and asks for a
// new one.
func (r *sqlSubscriberRun) shutdown() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancelSub()
	r.restarted <- struct{}{}
}

// subscribe starts a new subscription of the consumer group; it keeps the previous one
// (closed) when that fails.
func (r *sqlSubscriberRun) subscribe() error {
	sub, err := wsql.NewSubscriber(r.db, wsql.SubscriberConfig{
		ConsumerGroup: r.consumer, SchemaAdapter: r.adapter, OffsetsAdapter: r.offsetsAdapter,
		InitializeSchema: true, PollInterval: 10 * time.Millisecond, ResendInterval: 5 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		return fmt.Errorf("watermill-sql subscriber: %w", err)
	}
	sctx, cancel := context.WithCancel(r.ctx)
	r.mu.Lock()
	r.cancelSub = cancel
	r.mu.Unlock()
	ch, err := sub.Subscribe(sctx, r.consumer)
	if err != nil {
		cancel()
		_ = sub.Close()
		return err
	}
	r.sub, r.ch = sub, ch
	return nil
}

// consume runs the subscription until the consumer group's offset has passed the run's n
// copies (or the handler acked a message itself), a minute at most.
func (r *sqlSubscriberRun) consume(n int) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case m, ok := <-r.ch:
			if err := r.received(m, ok); err != nil {
				return err
			}
		case <-r.out.selfAcked:
			// The handler acked the subscriber's message: the subscriber may have committed
			// its transaction under the middleware, and the run may never end. The verdict
			// is known.
			return nil
		case <-r.restarted:
			if err := r.restart(); err != nil {
				return err
			}
		case <-tick.C:
			if done, err := r.done(n, deadline); done || err != nil {
				return err
			}
		}
	}
}

// restart subscribes again: the subscriber's transaction is rolled back and a new one reads
// the unacked copies again.
func (r *sqlSubscriberRun) restart() error {
	_ = r.sub.Close()
	return r.subscribe()
}

// received delivers a message the subscription sent (ok false: its channel closed, as it is
// when the subscription is restarted).
func (r *sqlSubscriberRun) received(m *message.Message, ok bool) error {
	if !ok {
		return nil
	}
	return r.deliver(m)
}

// done says whether the consumer group's offset has passed the run's n copies, and fails once
// deadline has passed without that.
func (r *sqlSubscriberRun) done(n int, deadline time.Time) (bool, error) {
	passed, err := r.passed()
	switch {
	case err != nil:
		return false, fmt.Errorf("read the subscriber's offset: %w", err)
	case passed:
		return true, nil
	case time.Now().After(deadline):
		return false, fmt.Errorf("the watermill-sql subscriber had not consumed the run's %d copies after a minute", n)
	}
	return false, nil
}

// deliver runs the chain on m and acks or nacks it as a router would; a copy that keeps
// failing is recorded and acked after maxRedeliveries.
func (r *sqlSubscriberRun) deliver(m *message.Message) error {
	id := m.Metadata.Get(metadataDelivery)
	r.attempts[id]++
	_, err := r.chain(m)
	if err != nil {
		r.out.sawDeliveryError(err)
		r.lastErr[id] = err
	}
	switch {
	case err == nil:
		m.Ack()
	case wmonce.IsPermanent(err) || wmonce.IsPanic(err):
		r.out.record(eventOf(id), err, false)
		m.Ack() // a real router parks it and acks
	case r.attempts[id] >= maxRedeliveries:
		r.out.record(eventOf(id), fmt.Errorf("copy %s: still failing after %d deliveries; the last one failed with: %w", id, maxRedeliveries, r.lastErr[id]), true)
		m.Ack()
	default:
		return r.retry(m, id)
	}
	return nil
}

// retry has the failed copy m delivered again, as the broker would.
func (r *sqlSubscriberRun) retry(m *message.Message, id string) error {
	switch {
	case r.requeue:
		// The subscriber would deliver this copy again and again before the next
		// one; a broker that requeues puts it behind the others: publish it again
		// at the end of the topic and go on, so an event refused until an earlier
		// one arrives (a version gap) lets that one through.
		if err := r.pub.Publish(r.consumer, m.Copy()); err != nil {
			return fmt.Errorf("publish copy %s again on watermill-sql topic %s: %w", id, r.consumer, err)
		}
		m.Ack()
	case r.attempts[id]%3 == 0:
		// Nacked copies come back in the same transaction, which a killed connection
		// has doomed: the subscriber would roll it back at its AckDeadline (30s by
		// default); the kit does so now by subscribing again.
		m.Nack()
		r.restarted <- struct{}{}
	default:
		m.Nack()
	}
	return nil
}

// passed says whether the consumer group's offset has passed every message of the topic.
func (r *sqlSubscriberRun) passed() (bool, error) {
	var passed bool
	err := r.db.QueryRowContext(r.ctx, `SELECT coalesce((SELECT offset_acked FROM `+r.offsets+` WHERE consumer_group = $1), 0)
		>= (SELECT max("offset") FROM `+r.messages+`)`, r.consumer).Scan(&passed)
	return passed, err
}

// anyMessageSchema is watermill-sql's PostgreSQL schema for any message the library takes:
// payloads as bytes (BYTEA, not the default JSON column: protobuf events, say) and UUIDs as
// text (not VARCHAR(36): the library takes UUIDs up to 1024 bytes).
type anyMessageSchema struct{ wsql.DefaultPostgreSQLSchema }

func (s anyMessageSchema) SchemaInitializingQueries(topic string) []wsql.Query {
	qs := s.DefaultPostgreSQLSchema.SchemaInitializingQueries(topic)
	for i := range qs {
		qs[i].Query = strings.Replace(qs[i].Query, `"uuid" VARCHAR(36) NOT NULL`, `"uuid" text NOT NULL`, 1)
	}
	return qs
}
