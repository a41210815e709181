package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
)

func TestMarshalerConvertsNonStringHeaders(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	d := amqp.Delivery{
		Body: []byte("p"),
		Headers: amqp.Table{
			"_watermill_message_uuid": "e-91",
			"x-delivery-count":        int64(3),
			"x-death": []any{amqp.Table{
				"count": int64(1), "reason": "rejected", "queue": "payments:rewards", "time": at,
				"routing-keys": []any{""},
			}},
			"flag":    true,
			"binary":  []byte{0xff, 0xfe},
			"text":    []byte("plain"),
			"price":   amqp.Decimal{Scale: 2, Value: 120000},
			"nothing": nil,
		},
	}
	_, err := wamqp.DefaultMarshaler{}.Unmarshal(d)
	require.ErrorContains(t, err, "is not a string", "Watermill's marshaler refuses these headers (and the subscriber then loops)")

	msg, err := broker.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	require.Equal(t, "e-91", msg.UUID)
	require.Equal(t, "3", msg.Metadata.Get("x-delivery-count"))
	require.Equal(t, "true", msg.Metadata.Get("flag"))
	require.Equal(t, "base64://4=", msg.Metadata.Get("binary"))
	require.Equal(t, "plain", msg.Metadata.Get("text"))
	require.Equal(t, "1200.00", msg.Metadata.Get("price"))
	require.Equal(t, "", msg.Metadata.Get("nothing"))
	require.NotContains(t, msg.Metadata, "_watermill_message_uuid")
	var death []map[string]any
	require.NoError(t, json.Unmarshal([]byte(msg.Metadata.Get("x-death")), &death))
	require.Equal(t, "rejected", death[0]["reason"])
	require.Equal(t, "2026-11-29T10:00:00Z", death[0]["time"])
	require.EqualValues(t, 1, death[0]["count"])

	noUUID, err := broker.Marshaler{}.Unmarshal(amqp.Delivery{Body: []byte("x"), Headers: amqp.Table{"_watermill_message_uuid": int64(7)}})
	require.NoError(t, err, "never refused: the middleware parks a message whose key is unusable")
	require.Equal(t, "7", noUUID.UUID)
}

// TestAMQPHeadersFromRabbitMQDoNotLoop sends, through a real RabbitMQ, a message carrying the
// kind of headers RabbitMQ itself adds after dead-lettering, and nacks it once so that the
// quorum queue adds x-delivery-count: it is delivered, converted and acked, and nothing is left.
func TestAMQPHeadersFromRabbitMQDoNotLoop(t *testing.T) {
	t.Parallel()
	topic := pgtest.NewName("payments")
	b := newBroker(t, broker.AMQP, broker.Subscription{Topic: topic, Group: "rewards"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pub, err := b.NewPublisher(ctx) // declares the exchange and the group's queue
	require.NoError(t, err)
	defer pub.Close()

	conn, err := amqp.Dial(b.Config().AMQP.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(ctx, b.Config().AMQP.ExchangeName(topic), "", false, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		Body:         []byte(`{"amount":1}`),
		Headers: amqp.Table{
			"_watermill_message_uuid": "e-91",
			"x-death":                 []any{amqp.Table{"count": int64(1), "reason": "expired", "queue": "elsewhere"}},
			"x-retries":               int32(2),
		},
	}))

	sub, err := b.NewSubscriber("rewards")
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	first := receiveOne(t, msgs)
	require.Equal(t, "e-91", first.UUID)
	require.Equal(t, "2", first.Metadata.Get("x-retries"))
	require.Contains(t, first.Metadata.Get("x-death"), `"reason":"expired"`)
	require.Empty(t, first.Metadata.Get("x-delivery-count"), "first delivery")
	first.Nack()

	second := receiveOne(t, msgs)
	require.Equal(t, "e-91", second.UUID)
	require.Equal(t, "1", second.Metadata.Get("x-delivery-count"), "the quorum queue counts the redelivery in a numeric header")
	second.Ack()

	q := b.Config().AMQP.QueueName(topic, "rewards")
	// The ack reaches RabbitMQ after Ack returns, and only RabbitMQ can tell: poll its queue.
	testwait.Until(t, "acked once, nothing left looping in the queue", func() bool {
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		require.NoError(t, err)
		return info.Messages == 0
	})
	select {
	case m := <-msgs:
		t.Fatalf("unexpected third delivery %s %v", m.UUID, m.Metadata)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestAMQPUnroutedMessagesAreKept publishes to a topic that no queue is bound to: RabbitMQ would
// drop it; the alternate exchange keeps it in the unrouted queue instead.
func TestAMQPUnroutedMessagesAreKept(t *testing.T) {
	t.Parallel()
	b := newBroker(t, broker.AMQP)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish("nobody-listens", message.NewMessage("lost-1", []byte("x"))))

	conn, err := amqp.Dial(b.Config().AMQP.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	unrouted, err := ch.ConsumeWithContext(ctx, b.Config().AMQP.UnroutedQueueName(), "", true, false, false, false, nil)
	require.NoError(t, err)
	d := testwait.Receive(t, unrouted, "the lost message from the unrouted queue")
	require.Equal(t, "lost-1", d.Headers["_watermill_message_uuid"])
}

func receiveOne(t *testing.T, ch <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "subscription closed")
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no message within 20s")
		return nil
	}
}

// TestAMQPConcurrencyHasThatManyInFlight: with the default Workers (8) a subscription
// hands over eight messages before any is acked, which is what lets one router handler run
// them at once; the ninth waits for an ack. With Workers 1 the suite's TestNoAck (run by
// TestConformanceAMQPOneAtATime) checks that the second waits.
func TestAMQPConcurrencyHasThatManyInFlight(t *testing.T) {
	t.Parallel()
	topic := pgtest.NewName("inflight")
	b := newBroker(t, broker.AMQP, broker.Subscription{Topic: topic, Group: "g"})
	const concurrency = 8
	require.Equal(t, concurrency, b.Config().AMQP.Workers)
	require.Equal(t, 4*concurrency, b.Config().AMQP.Prefetch)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	for i := range concurrency + 1 {
		require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprint("m-", i), []byte("x"))))
	}
	sub, err := b.NewSubscriber("g")
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	var held []*message.Message
	for range concurrency {
		held = append(held, receiveOne(t, ch))
	}
	select {
	case m := <-ch:
		t.Fatalf("message %s was handed over while %d were unacked", m.UUID, concurrency)
	case <-time.After(200 * time.Millisecond):
	}
	held[0].Ack()
	last := receiveOne(t, ch)
	last.Ack()
	for _, m := range held[1:] {
		m.Ack()
	}
}

// TestMarshalerExposesAMQPProperties: a producer that is not Watermill identifies its messages
// with AMQP properties, not headers. Each property is visible as metadata (so KeyFromMetadata
// can key by it), and the message-id property is the UUID when no UUID header is set (so the
// default key works too). Explicit headers win: the UUID header over message-id, a header over
// a property of the same metadata name. The names are spelled out: they are what users configure.
func TestMarshalerExposesAMQPProperties(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 29, 10, 0, 5, 0, time.FixedZone("IST", 5*3600+1800))
	foreign := amqp.Delivery{
		Body:            []byte(`{"amount":1}`),
		MessageId:       "pay-42",
		CorrelationId:   "order-7",
		Timestamp:       at,
		Type:            "payment.settled",
		AppId:           "billing",
		UserId:          "svc-billing",
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		ReplyTo:         "replies",
		Expiration:      "60000",
		Priority:        5,
		DeliveryMode:    amqp.Persistent,
		Headers:         amqp.Table{"tenant": "t-1"},
	}
	msg, err := broker.Marshaler{}.Unmarshal(foreign)
	require.NoError(t, err)
	require.Equal(t, "pay-42", msg.UUID, "no UUID header: the message-id property is the UUID")
	require.Equal(t, message.Metadata{
		"tenant":                "t-1",
		"amqp_message_id":       "pay-42",
		"amqp_correlation_id":   "order-7",
		"amqp_timestamp":        "2026-11-29T04:30:05Z",
		"amqp_type":             "payment.settled",
		"amqp_app_id":           "billing",
		"amqp_user_id":          "svc-billing",
		"amqp_content_type":     "application/json",
		"amqp_content_encoding": "gzip",
		"amqp_reply_to":         "replies",
		"amqp_expiration":       "60000",
		"amqp_priority":         "5",
	}, msg.Metadata)

	both, err := broker.Marshaler{}.Unmarshal(amqp.Delivery{
		MessageId:   "pay-42",
		Headers:     amqp.Table{"_watermill_message_uuid": "e-91", "amqp_content_type": "text/plain"},
		ContentType: "application/json",
	})
	require.NoError(t, err)
	require.Equal(t, "e-91", both.UUID, "the UUID header wins over message-id")
	require.Equal(t, "pay-42", both.Metadata.Get("amqp_message_id"))
	require.Equal(t, "text/plain", both.Metadata.Get("amqp_content_type"), "a header wins over a property")

	bare, err := broker.Marshaler{}.Unmarshal(amqp.Delivery{Body: []byte("x")})
	require.NoError(t, err)
	require.Empty(t, bare.UUID, "no id at all: an empty UUID, refused by the middleware")
	require.Empty(t, bare.Metadata, "unset properties add nothing")

	// Our own messages carry their UUID in the message-id property too, for consumers that are
	// not Watermill, and come back with the metadata they had plus that property.
	out := message.NewMessage("e-91", []byte("p"))
	out.Metadata.Set("tenant", "t-1")
	pub, err := broker.Marshaler{}.Marshal(out)
	require.NoError(t, err)
	require.Equal(t, "e-91", pub.MessageId)
	back, err := broker.Marshaler{}.Unmarshal(amqp.Delivery{Headers: pub.Headers, MessageId: pub.MessageId, DeliveryMode: pub.DeliveryMode, Body: pub.Body})
	require.NoError(t, err)
	require.Equal(t, "e-91", back.UUID)
	require.Equal(t, message.Metadata{"tenant": "t-1", "amqp_message_id": "e-91"}, back.Metadata)
}

// TestAMQPForeignProducerWithOnlyAMQPProperties publishes, through a real RabbitMQ, the way a
// producer that is not Watermill does: an id in the message-id property, no headers at all. The
// delivery is keyed by that id both ways (the default UUID key and KeyFromMetadata), and its
// other properties are readable as metadata.
func TestAMQPForeignProducerWithOnlyAMQPProperties(t *testing.T) {
	t.Parallel()
	topic := pgtest.NewName("payments")
	b := newBroker(t, broker.AMQP, broker.Subscription{Topic: topic, Group: "rewards"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, b.Declare(ctx, b.Config().Subscriptions...))

	conn, err := amqp.Dial(b.Config().AMQP.URL)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	at := time.Date(2026, 11, 29, 10, 0, 5, 0, time.UTC)
	require.NoError(t, ch.PublishWithContext(ctx, b.Config().AMQP.ExchangeName(topic), "", false, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, Body: []byte(`{"amount":1}`),
		MessageId: "pay-42", CorrelationId: "order-7", Timestamp: at, ContentType: "application/json",
	}))

	sub, err := b.NewSubscriber("rewards")
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	msg := receiveOne(t, msgs)
	defer msg.Ack()
	require.Equal(t, "pay-42", msg.UUID)
	key, err := wmonce.KeyFromMetadata(broker.MetadataAMQPMessageID)(msg)
	require.NoError(t, err)
	require.Equal(t, "pay-42", key)
	require.Equal(t, "order-7", msg.Metadata.Get(broker.MetadataAMQPCorrelationID))
	require.Equal(t, "2026-11-29T10:00:05Z", msg.Metadata.Get(broker.MetadataAMQPTimestamp))
	require.Equal(t, "application/json", msg.Metadata.Get(broker.MetadataAMQPContentType))
}

// TestAMQPPublishedBeforeTheFirstSubscriberIsDelivered publishes, with the default
// configuration (no Config.Subscriptions), to a topic nobody has subscribed to yet: RabbitMQ
// has no queue to route to, and the messages wait in the unrouted queue. A consumer process
// that then subscribes receives every one of them, as on Kafka and SQL, and the unrouted
// messages of other topics stay where they were, even one whose exchange no longer exists.
func TestAMQPPublishedBeforeTheFirstSubscriberIsDelivered(t *testing.T) {
	t.Parallel()
	topic, other, gone := pgtest.NewName("payments"), pgtest.NewName("nobody-listens"), pgtest.NewName("deleted")
	producer := newBroker(t, broker.AMQP)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pub, err := producer.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	want := map[string]bool{}
	for i := range 5 {
		id := fmt.Sprint("early-", i)
		want[id] = true
		require.NoError(t, pub.Publish(topic, message.NewMessage(id, []byte("x"))))
	}
	require.NoError(t, pub.Publish(other, message.NewMessage("other-1", []byte("x")), message.NewMessage("other-2", []byte("x"))))
	require.NoError(t, pub.Publish(gone, message.NewMessage("gone-1", []byte("x"))))
	require.NoError(t, producer.DeleteAMQPTopology(broker.Subscription{Topic: gone, Group: "none"})) // its exchange
	unrouted := func() int {
		return brokertest.AMQPQueueDepth(t, producer.Config().AMQP.URL, producer.Config().AMQP.UnroutedQueueName())
	}
	require.Equal(t, 8, unrouted(), "confirmed publishes with no queue bound: kept in the unrouted queue")

	consumer, err := broker.New(ctx, nil, producer.Config(), watermill.NopLogger{}) // another process
	require.NoError(t, err)
	defer consumer.Close()
	sub, err := consumer.NewSubscriber("rewards")
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	got := map[string]bool{}
	for _, m := range receive(t, msgs, 5, 20*time.Second) {
		got[m.UUID] = true
	}
	require.Equal(t, want, got, "5 of 5 published before the first subscriber")
	require.Equal(t, 3, unrouted(), "the other topics' messages are still kept, also the one whose exchange was deleted")

	require.NoError(t, pub.Publish(topic, message.NewMessage("late-1", []byte("x"))))
	require.Equal(t, "late-1", receive(t, msgs, 1, 20*time.Second)[0].UUID)
}

// Quorum queues are declared with AMQPConfig.DeliveryLimit, so RabbitMQ 4's default of 20
// deliveries does not drop a message whose handler fails for a while. A queue that exists
// without a limit (declared by an earlier version) is kept as it is, with a warning, and
// works.
func TestAMQPQuorumQueuesCarryTheDeliveryLimit(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	cfg := brokertest.Config(t, broker.AMQP, pgtest.Schema(t, db))
	topic := pgtest.NewName("payments")
	conn, err := amqp.Dial(cfg.AMQP.URL)
	require.NoError(t, err)
	defer conn.Close()
	quorumOnly := amqp.Table{"x-queue-type": "quorum"}
	declareAs := func(queue string, args amqp.Table) error {
		ch, err := conn.Channel()
		require.NoError(t, err)
		defer ch.Close()
		_, err = ch.QueueDeclare(queue, true, false, false, false, args)
		return err
	}
	old := cfg.AMQP.QueueName(topic, "old")
	require.NoError(t, declareAs(old, quorumOnly))

	cfg.AMQP.DeliveryLimit = 7
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "new"}, {Topic: topic, Group: "old"}}
	logs := watermill.NewCaptureLogger()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := broker.New(ctx, db, cfg, logs)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close()) }()
	pub, err := b.NewPublisher(ctx) // declares both groups' queues
	require.NoError(t, err)
	defer pub.Close()

	err = declareAs(cfg.AMQP.QueueName(topic, "new"), quorumOnly)
	require.ErrorContains(t, err, "inequivalent arg 'x-delivery-limit'", "the new queue carries a limit")
	require.ErrorContains(t, err, "'7'")
	require.NoError(t, declareAs(old, quorumOnly), "the old queue is unchanged")
	warned := 0
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		if m.Fields["queue"] == old {
			require.Contains(t, m.Msg, "drops a message delivered 20 times")
			warned++
		}
	}
	require.Equal(t, 1, warned, "one warning for the old queue")

	sub, err := b.NewSubscriber("old")
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(topic, message.NewMessage("e-1", []byte("x"))))
	got := receiveOne(t, msgs)
	require.Equal(t, "e-1", got.UUID)
	got.Ack()
}
