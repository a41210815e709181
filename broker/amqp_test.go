package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
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
	testwait.Until(t, "the lost message in the unrouted queue", func() bool {
		info, err := ch.QueueDeclarePassive(b.Config().AMQP.UnroutedQueueName(), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		require.NoError(t, err)
		return info.Messages == 1
	})
	d, ok, err := ch.Get(b.Config().AMQP.UnroutedQueueName(), true)
	require.NoError(t, err)
	require.True(t, ok)
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
