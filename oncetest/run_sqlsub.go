package oncetest

import (
	"context"
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
	db, schema := k.cfg.DB, k.cfg.Schema
	table := func(t string) string { return pgtx.QualifiedName(schema, "watermill_"+t) }
	offsets := func(t string) string { return pgtx.QualifiedName(schema, "watermill_offsets_"+t) }
	adapter := anyMessageSchema{wsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: table, SubscribeBatchSize: 1,
		GeneratePayloadType: func(string) string { return "BYTEA" },
	}}
	offsetsAdapter := wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: offsets}
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: adapter, AutoInitializeSchema: true}, watermill.NopLogger{})
	if err != nil {
		return fmt.Errorf("watermill-sql publisher: %w", err)
	}
	msgs := make([]*message.Message, len(copies))
	for i, c := range copies {
		msgs[i] = c.msg.Copy()
	}
	if err := pub.Publish(consumer, msgs...); err != nil {
		return fmt.Errorf("publish the copies on watermill-sql topic %s: %w", consumer, err)
	}
	chain, mw, err := k.chain(h, ModeSubscriberTx, consumer, topic, in)
	if err != nil {
		return err
	}
	defer func() { _ = mw.Close() }()

	var mu sync.Mutex
	var cancelSub context.CancelFunc
	restarted := make(chan struct{}, 2)
	in.shutdown = func(string) {
		mu.Lock()
		defer mu.Unlock()
		cancelSub()
		restarted <- struct{}{}
	}
	attempts := map[string]int{}
	lastErr := map[string]error{}
	subscribe := func() (message.Subscriber, <-chan *message.Message, error) {
		sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
			ConsumerGroup: consumer, SchemaAdapter: adapter, OffsetsAdapter: offsetsAdapter,
			InitializeSchema: true, PollInterval: 10 * time.Millisecond, ResendInterval: 5 * time.Millisecond,
		}, watermill.NopLogger{})
		if err != nil {
			return nil, nil, fmt.Errorf("watermill-sql subscriber: %w", err)
		}
		sctx, cancel := context.WithCancel(ctx)
		mu.Lock()
		cancelSub = cancel
		mu.Unlock()
		ch, err := sub.Subscribe(sctx, consumer)
		if err != nil {
			cancel()
			_ = sub.Close()
			return nil, nil, err
		}
		return sub, ch, nil
	}
	sub, ch, err := subscribe()
	if err != nil {
		return err
	}
	defer func() { _ = sub.Close() }()
	done := func() (bool, error) {
		var passed bool
		err := db.QueryRowContext(ctx, `SELECT coalesce((SELECT offset_acked FROM `+offsets(consumer)+` WHERE consumer_group = $1), 0)
			>= (SELECT max("offset") FROM `+table(consumer)+`)`, consumer).Scan(&passed)
		return passed, err
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case m, ok := <-ch:
			if !ok {
				continue
			}
			id := m.Metadata.Get(metadataDelivery)
			attempts[id]++
			_, err := chain(m)
			if err != nil {
				out.sawDeliveryError(err)
				lastErr[id] = err
			}
			switch {
			case err == nil:
				m.Ack()
			case wmonce.IsPermanent(err) || wmonce.IsPanic(err):
				out.record(eventOf(id), err, false)
				m.Ack() // a real router parks it and acks
			case attempts[id] >= maxRedeliveries:
				out.record(eventOf(id), fmt.Errorf("copy %s: still failing after %d deliveries; the last one failed with: %w", id, maxRedeliveries, lastErr[id]), true)
				m.Ack()
			case s.fault == FaultReorder:
				// The subscriber would deliver this copy again and again before the next
				// one; a broker that requeues puts it behind the others: publish it again
				// at the end of the topic and go on, so an event refused until an earlier
				// one arrives (a version gap) lets that one through.
				if err := pub.Publish(consumer, m.Copy()); err != nil {
					return fmt.Errorf("publish copy %s again on watermill-sql topic %s: %w", id, consumer, err)
				}
				m.Ack()
			case attempts[id]%3 == 0:
				// Nacked copies come back in the same transaction, which a killed connection
				// has doomed: the subscriber would roll it back at its AckDeadline (30s by
				// default); the kit does so now by subscribing again.
				m.Nack()
				restarted <- struct{}{}
			default:
				m.Nack()
			}
		case <-out.selfAcked:
			// The handler acked the subscriber's message: the subscriber may have committed
			// its transaction under the middleware, and the run may never end. The verdict
			// is known.
			return nil
		case <-restarted:
			_ = sub.Close()
			if sub, ch, err = subscribe(); err != nil {
				return err
			}
		case <-tick.C:
			ok, err := done()
			if err != nil {
				return fmt.Errorf("read the subscriber's offset: %w", err)
			}
			if ok {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the watermill-sql subscriber had not consumed the run's %d copies after a minute", len(copies))
			}
		}
	}
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
