// Package brokerkfake holds the broker package's tests that need a Kafka broker of their own
// to inspect or make misbehave (franz-go's kfake, through internal/embeddedkafka): they live in
// the e2e module so that the library's go.mod does not require kfake. They are black-box tests
// of package broker and need no service: `go test -short` runs them.
package brokerkfake_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/embeddedkafka"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TestKafkaProducerIsIdempotentOnKfake checks that Sarama's idempotent producer works against
// the embedded broker: it asks for a producer id (InitProducerID), produces with acks=all, and
// the records arrive.
func TestKafkaProducerIsIdempotentOnKfake(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ek, err := embeddedkafka.Start(ctx, nil)
	require.NoError(t, err)
	defer ek.Close()

	var initProducerID, acksAll atomic.Int32
	ek.Cluster().ControlKey(22, func(kmsg.Request) (kmsg.Response, error, bool) {
		ek.Cluster().KeepControl()
		initProducerID.Add(1)
		return nil, nil, false
	})
	ek.Cluster().ControlKey(0, func(req kmsg.Request) (kmsg.Response, error, bool) {
		ek.Cluster().KeepControl()
		p := req.(*kmsg.ProduceRequest)
		if p.Acks == -1 && len(p.Topics) > 0 {
			acksAll.Add(1)
		}
		return nil, nil, false
	})

	topic := pgtest.NewName("idem")
	b, err := broker.New(ctx, nil, broker.Config{Kind: broker.Kafka, Kafka: broker.KafkaConfig{Brokers: ek.Addrs()},
		Subscriptions: []broker.Subscription{{Topic: topic, Group: "g"}}}, nil)
	require.NoError(t, err)
	defer b.Close()
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("a", []byte("1")), message.NewMessage("b", []byte("2"))))
	require.GreaterOrEqual(t, initProducerID.Load(), int32(1), "the idempotent producer asked for a producer id")
	require.GreaterOrEqual(t, acksAll.Load(), int32(1), "records were produced with acks=all (both in one request, or one each)")

	sub, err := b.NewSubscriber("g")
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	got := receive(t, ch, 2, 30*time.Second)
	require.ElementsMatch(t, []string{"a", "b"}, []string{got[0].UUID, got[1].UUID})
}

func TestKafkaRequirePartitionKeyRefusesMessagesWithoutIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ek, err := embeddedkafka.Start(ctx, nil)
	require.NoError(t, err)
	defer ek.Close()
	b, err := broker.New(ctx, nil, broker.Config{Kind: broker.Kafka, Kafka: broker.KafkaConfig{Brokers: ek.Addrs(), RequirePartitionKey: true}}, nil)
	require.NoError(t, err)
	defer b.Close()
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	err = pub.Publish("orders", message.NewMessage("no-key", nil))
	require.ErrorContains(t, err, `no "partition_key" metadata`)
	keyed := message.NewMessage("keyed", nil)
	keyed.Metadata.Set("partition_key", "customer-1")
	require.NoError(t, pub.Publish("orders", keyed))
}

// TestKafkaCreatedTopics: a Broker reports the topics it created, not those it found.
func TestKafkaCreatedTopics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ek, err := embeddedkafka.Start(ctx, nil)
	require.NoError(t, err)
	defer ek.Close()
	topic := pgtest.NewName("made")
	cfg := broker.Config{Kind: broker.Kafka, Kafka: broker.KafkaConfig{Brokers: ek.Addrs()}}
	sub := broker.Subscription{Topic: topic, Group: "g"}
	first, err := broker.New(ctx, nil, cfg, nil)
	require.NoError(t, err)
	defer first.Close()
	require.NoError(t, first.Declare(ctx, sub))
	require.Equal(t, []string{topic}, first.CreatedKafkaTopics())
	second, err := broker.New(ctx, nil, cfg, nil)
	require.NoError(t, err)
	defer second.Close()
	require.NoError(t, second.Declare(ctx, sub))
	require.Empty(t, second.CreatedKafkaTopics(), "the topic existed already")
	require.NoError(t, first.DeleteKafkaTopics(first.CreatedKafkaTopics()...))
}

// receive reads n messages, acking each, or fails at the deadline (broker_test's receive).
func receive(t *testing.T, ch <-chan *message.Message, n int, timeout time.Duration) []*message.Message {
	t.Helper()
	var got []*message.Message
	deadline := time.After(timeout)
	for len(got) < n {
		select {
		case m, ok := <-ch:
			require.True(t, ok, "subscription closed after %d of %d messages", len(got), n)
			got = append(got, m)
			m.Ack()
		case <-deadline:
			t.Fatalf("received %d of %d messages within %s; %s", len(got), n, timeout, pgtest.OldTransactions(t, timeout/2))
		}
	}
	return got
}
