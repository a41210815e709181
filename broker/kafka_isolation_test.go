package broker_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TestKafkaSubscriberSkipsAbortedTransactions writes a record in a Kafka transaction that is
// aborted, then one in a transaction that commits (what Debezium's connector with exactly-once
// source support does when a worker dies mid-transaction and its task runs again), then a
// record of the broker's own, non-transactional publisher. The subscriber must deliver the
// committed record and the publisher's, in that order, and never the aborted one.
func TestKafkaSubscriberSkipsAbortedTransactions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := brokertest.Config(t, broker.Kafka, "")
	cfg.Kafka.Partitions = 1 // one partition: the order of the three records is the log's
	topic := pgtest.NewName("txn")
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "g"}}
	b, err := broker.New(ctx, nil, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	brokertest.DeleteCreatedKafkaTopics(t, b)
	require.NoError(t, b.Declare(ctx, cfg.Subscriptions[0]))

	producer, err := kgo.NewClient(kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.TransactionalID("wmonce-test-"+topic), kgo.DefaultProduceTopic(topic))
	require.NoError(t, err)
	defer producer.Close()
	inTransaction := func(uuid string, commit kgo.TransactionEndTry) {
		t.Helper()
		require.NoError(t, producer.BeginTransaction())
		rec := &kgo.Record{Value: []byte(uuid), Headers: []kgo.RecordHeader{{Key: "_watermill_message_uuid", Value: []byte(uuid)}}}
		require.NoError(t, producer.ProduceSync(ctx, rec).FirstErr())
		require.NoError(t, producer.EndTransaction(ctx, commit))
	}
	inTransaction("aborted", kgo.TryAbort)
	inTransaction("committed", kgo.TryCommit)
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("plain", []byte("plain"))))

	sub, err := b.NewSubscriber("g")
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	got := receive(t, ch, 2, time.Minute)
	require.Equal(t, []string{"committed", "plain"}, []string{got[0].UUID, got[1].UUID},
		"the record of the aborted transaction must not be delivered")
}
