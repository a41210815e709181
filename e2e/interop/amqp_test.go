package interop_test

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
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// env is one test's PostgreSQL schema (with an effects table the handlers write to in their
// transaction) and RabbitMQ virtual host.
type env struct {
	db      *sql.DB
	schema  string
	amqpURL string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "effects")+` (id bigserial PRIMARY KEY, event_id text NOT NULL)`)
	return &env{db: db, schema: schema, amqpURL: brokertest.AMQPVhost(t)}
}

func (e *env) table(name string) string { return pgtx.QualifiedName(e.schema, name) }

// effect records one effect of msg in the transaction the middleware or processor opened.
func (e *env) effect(msg *message.Message) error {
	tx, ok := pgtx.TxFromContext(msg.Context())
	if !ok {
		return errors.New("no transaction in the message context")
	}
	_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+e.table("effects")+` (event_id) VALUES ($1)`, msg.UUID)
	return err
}

func (e *env) effects(t *testing.T, eventID string) int {
	return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE event_id = $1`, eventID)
}

// outboxed counts the outbox rows waiting for topic.
func (e *env) outboxed(t *testing.T, topic string) int {
	return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE payload->>'destination_topic' = $1`, topic)
}

func logger() watermill.LoggerAdapter {
	if testing.Verbose() {
		return watermill.NewStdLogger(false, false)
	}
	return watermill.NopLogger{}
}

// theirConfig is watermill-amqp's durable pub/sub configuration (a fanout exchange per topic, a
// queue per topic and group), set up against its known pitfalls (see the package doc):
// publisher confirms on, a marshaler that reads RabbitMQ's own numeric and table headers, and
// quorum queues, which add such a header (x-delivery-count) to every redelivery.
func theirConfig(amqpURL, group string) wamqp.Config {
	cfg := wamqp.NewDurablePubSubConfig(amqpURL, wamqp.GenerateQueueNameTopicNameWithSuffix(group))
	cfg.Publish.ConfirmDelivery = true
	cfg.Marshaler = broker.Marshaler{}
	cfg.Queue.Arguments = amqp.Table{"x-queue-type": "quorum"}
	return cfg
}

func theirPublisher(t *testing.T, amqpURL string) *wamqp.Publisher {
	t.Helper()
	pub, err := wamqp.NewPublisher(theirConfig(amqpURL, ""), logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// theirSubscriber returns a watermill-amqp subscriber of group and declares its queue on each
// topic: watermill-amqp's publisher declares no queue, and RabbitMQ drops what it cannot route.
func theirSubscriber(t *testing.T, amqpURL, group string, topics ...string) *wamqp.Subscriber {
	t.Helper()
	sub, err := wamqp.NewSubscriber(theirConfig(amqpURL, group), logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	for _, topic := range topics {
		require.NoError(t, sub.SubscribeInitialize(topic))
	}
	return sub
}

// queueDepth is the number of ready messages in a queue.
func queueDepth(t *testing.T, amqpURL, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	return q.Messages
}

// waitDrained waits until queue holds no ready message: what was delivered has been acked, not
// requeued. Only RabbitMQ knows when an ack has arrived, so this polls it: an effect in another
// process, which no signal of ours can report.
func waitDrained(t *testing.T, amqpURL, queue, what string) {
	t.Helper()
	testwait.Until(t, what, func() bool { return queueDepth(t, amqpURL, queue) == 0 })
}

// drain takes every message from a queue and returns their UUIDs and metadata.
func drain(t *testing.T, amqpURL, queue string) map[string]message.Metadata {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	got := map[string]message.Metadata{}
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return got
		}
		msg, err := broker.Marshaler{}.Unmarshal(d)
		require.NoError(t, err)
		got[msg.UUID] = msg.Metadata
	}
}

func runRouter(t *testing.T, add func(r *message.Router)) {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, logger())
	require.NoError(t, err)
	add(r)
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	t.Cleanup(func() { _ = r.Close() })
}

func publish(t *testing.T, pub message.Publisher, topic, eventID string, copies int) {
	t.Helper()
	for range copies {
		require.NoError(t, pub.Publish(topic, message.NewMessage(eventID, []byte(`{"payment_id":"pay_42","paise":120000}`))))
	}
}

// relayTo forwards the outbox through watermill-amqp's publisher (confirms on) until want
// messages were published. A round can find nothing yet: rows become visible to the relay only
// when every older transaction on the server has finished (other tests share the server).
func relayTo(t *testing.T, e *env, pub message.Publisher, want int) {
	t.Helper()
	relay, err := outbox.NewRelay(e.db, pub, outbox.RelayConfig{Schema: e.schema}, logger())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Timeout)
	defer cancel()
	published := 0
	testwait.Until(t, fmt.Sprintf("the relay to publish %d messages", want), func() bool {
		n, err := relay.RelayOnce(ctx)
		require.NoError(t, err)
		published += n
		require.LessOrEqual(t, published, want, "published more than the outbox held")
		return published == want
	})
}

// TestMiddlewareOverWatermillAMQP puts the effectively-once middleware in front of a handler
// fed by watermill-amqp's own Subscriber and Publisher: five copies of one event apply once;
// an event whose first attempt fails after writing is nacked, requeued by RabbitMQ (the quorum
// queue marks the redelivery with a numeric x-delivery-count header, which watermill-amqp's
// default marshaler would refuse forever) and applied once; the handler's outputs go to the
// outbox, not to the router's publisher, and reach RabbitMQ through the relay.
func TestMiddlewareOverWatermillAMQP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pub := theirPublisher(t, e.amqpURL)
	sub := theirSubscriber(t, e.amqpURL, "rewards", "payments")
	theirSubscriber(t, e.amqpURL, "notifications", "cashback") // the outputs' queue

	mw, err := once.New(e.db, once.Config{Schema: e.schema, Consumer: "rewards"}, logger())
	require.NoError(t, err)
	var failedOnce atomic.Bool
	var mu sync.Mutex
	deliveryCounts := map[string][]string{} // x-delivery-count seen by the handler per event
	handler := func(msg *message.Message) ([]*message.Message, error) {
		mu.Lock()
		deliveryCounts[msg.UUID] = append(deliveryCounts[msg.UUID], msg.Metadata.Get("x-delivery-count"))
		mu.Unlock()
		if err := e.effect(msg); err != nil {
			return nil, err
		}
		if msg.UUID == "e-fails-once" && failedOnce.CompareAndSwap(false, true) {
			return nil, errors.New("first attempt fails after writing its effect")
		}
		return []*message.Message{message.NewMessage("cashback-"+msg.UUID, []byte(`{"paise":2400}`))}, nil
	}
	// A handler with a publisher: without the middleware the router would publish the outputs
	// straight to RabbitMQ, outside the transaction.
	runRouter(t, func(r *message.Router) {
		r.AddHandler("rewards", "payments", sub, "cashback", pub, handler).AddMiddleware(mw.Middleware)
	})

	publish(t, pub, "payments", "e-91", 5)
	publish(t, pub, "payments", "e-fails-once", 1)
	testwait.Until(t, "two events applied, four copies absorbed, one attempt failed", func() bool {
		return mw.Counters().Consumer("rewards") == once.Counters{Fresh: 2, Duplicates: 4, Failed: 1}
	})

	require.Equal(t, 1, e.effects(t, "e-91"), "five copies, one effect")
	require.Equal(t, 1, e.effects(t, "e-fails-once"), "the failed attempt's write was rolled back; the redelivery applied it once")
	mu.Lock()
	require.Len(t, deliveryCounts["e-91"], 1, "the four copies were absorbed before the handler")
	require.Equal(t, []string{"", "1"}, deliveryCounts["e-fails-once"], "nacked, requeued by RabbitMQ and redelivered, counted by the quorum queue")
	mu.Unlock()
	waitDrained(t, e.amqpURL, "payments_rewards", "every copy acked")

	require.Equal(t, 2, e.outboxed(t, "cashback"), "one output per applied event, in the outbox")
	require.Equal(t, 0, queueDepth(t, e.amqpURL, "cashback_notifications"), "the router published nothing itself")
	relayTo(t, e, pub, 2)
	got := drain(t, e.amqpURL, "cashback_notifications")
	require.Len(t, got, 2)
	require.Equal(t, "e-91", got["cashback-e-91"].Get("causation_id"))
	require.Equal(t, "e-fails-once", got["cashback-e-fails-once"].Get("causation_id"))
}

// TestStackOverWatermillAMQP runs the recommended middleware Stack over watermill-amqp: a
// transient failure is retried in-process with backoff (no nack, so no immediate requeue by
// watermill-amqp) and applied once; a permanent failure is parked in the outbox and acked
// instead of looping; outputs go to the outbox.
func TestStackOverWatermillAMQP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pub := theirPublisher(t, e.amqpURL)
	sub := theirSubscriber(t, e.amqpURL, "rewards", "payments")

	mw, err := once.New(e.db, once.Config{Schema: e.schema}, logger()) // consumer: the handler name
	require.NoError(t, err)
	writer, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	stack, err := once.Stack(once.StackConfig{
		Middleware:      mw,
		PoisonPublisher: writer.ParkingPublisher(e.db),
		PoisonTopic:     "payments-parked",
		Retry:           wmiddleware.Retry{InitialInterval: 5 * time.Millisecond},
		Logger:          logger(),
	})
	require.NoError(t, err)
	var transientFailed atomic.Bool
	var redelivered atomic.Int32
	runRouter(t, func(r *message.Router) {
		r.AddConsumerHandler("rewards", "payments", sub, func(msg *message.Message) error {
			if msg.Metadata.Get("x-delivery-count") != "" {
				redelivered.Add(1)
			}
			if err := e.effect(msg); err != nil {
				return err
			}
			switch {
			case msg.UUID == "e-transient" && transientFailed.CompareAndSwap(false, true):
				return errors.New("database hiccup")
			case msg.UUID == "e-poison":
				return wmonce.Permanent(errors.New("payment refers to an unknown account"))
			}
			out := message.NewMessage("cashback-"+msg.UUID, []byte(`{"paise":2400}`))
			out.SetContext(msg.Context()) // the middleware's transaction: the outbox row commits with the effect
			return writer.Publisher().Publish("cashback", out)
		}).AddMiddleware(stack...)
	})

	publish(t, pub, "payments", "e-transient", 2)
	publish(t, pub, "payments", "e-poison", 1)
	testwait.Until(t, "one event applied, one copy absorbed, two attempts failed", func() bool {
		return mw.Counters().Consumer("rewards") == once.Counters{Fresh: 1, Duplicates: 1, Failed: 2}
	})
	waitDrained(t, e.amqpURL, "payments_rewards", "every message acked, the poison one too")
	require.Equal(t, 1, e.effects(t, "e-transient"))
	require.Equal(t, 0, e.effects(t, "e-poison"), "rolled back")
	require.Equal(t, int32(0), redelivered.Load(), "nothing went back to RabbitMQ")
	require.Equal(t, 1, e.outboxed(t, "cashback"))
	require.Equal(t, 1, e.outboxed(t, "payments-parked"), "the poison message is parked, not looping")
}

// TestInboxOverWatermillAMQP stores watermill-amqp deliveries with the inbox receiver: five
// copies and a redelivery after a lost ack make one row; the processor applies it once although
// its first attempt fails, and its output goes to the outbox and, through the relay, to
// RabbitMQ.
func TestInboxOverWatermillAMQP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pub := theirPublisher(t, e.amqpURL)
	sub := theirSubscriber(t, e.amqpURL, "rewards", "payments")
	theirSubscriber(t, e.amqpURL, "notifications", "cashback")

	receiver, err := inbox.NewReceiver(e.db, inbox.ReceiverConfig{Schema: e.schema, Consumer: "rewards"}, logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = receiver.Close() })
	var ackLost atomic.Bool
	runRouter(t, func(r *message.Router) {
		r.AddConsumerHandler("rewards-inbox", "payments", sub, func(msg *message.Message) error {
			if err := receiver.Handle(msg); err != nil {
				return err
			}
			if ackLost.CompareAndSwap(false, true) {
				return errors.New("stored, but the ack is lost") // nack: RabbitMQ redelivers a stored message
			}
			return nil
		})
	})
	publish(t, pub, "payments", "e-91", 5)
	testwait.Until(t, "one row for five copies and a redelivery", func() bool {
		got := receiver.Counters()
		return got.Stored == 1 && got.Duplicates == 5
	})
	waitDrained(t, e.amqpURL, "payments_rewards", "the queue to be drained")

	var failedOnce atomic.Bool
	processor, err := inbox.NewProcessor(e.db, func(msg *message.Message) ([]*message.Message, error) {
		if err := e.effect(msg); err != nil {
			return nil, err
		}
		if failedOnce.CompareAndSwap(false, true) {
			return nil, errors.New("first attempt fails after writing its effect")
		}
		return []*message.Message{message.NewMessage("cashback-"+msg.UUID, []byte(`{"paise":2400}`))}, nil
	}, inbox.ProcessorConfig{
		Schema: e.schema, Consumer: "rewards", OutputTopic: "cashback",
		Backoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, PollInterval: 50 * time.Millisecond,
	}, logger())
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- processor.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = processor.Close()
		require.NoError(t, <-done)
	})
	testwait.Until(t, "the row processed once, after one failed attempt", func() bool {
		got := processor.Counters()
		return got.Processed == 1 && got.Failed == 1
	})
	require.Equal(t, 1, e.effects(t, "e-91"), "the failed attempt was rolled back")
	require.Equal(t, 1, e.outboxed(t, "cashback"))

	relayTo(t, e, pub, 1)
	got := drain(t, e.amqpURL, "cashback_notifications")
	require.Len(t, got, 1)
	require.Equal(t, "e-91", got["cashback-e-91"].Get("causation_id"))
}
