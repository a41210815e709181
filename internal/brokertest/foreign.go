package brokertest

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// OnePartitionKafka declares a new Kafka topic (a unique name starting with prefix) with a
// single partition, so that a message nacked forever stops every message behind it, and
// returns its name and a subscriber of the broker package consuming it as group. The topic is
// deleted and the subscriber closed when t ends.
func OnePartitionKafka(t testing.TB, prefix, group string) (string, message.Subscriber) {
	t.Helper()
	cfg := Config(t, broker.Kafka, "")
	cfg.Kafka.Partitions = 1
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.New(ctx, nil, cfg, nil)
	if err != nil {
		t.Fatalf("Kafka broker: %v", err)
	}
	topic := pgtest.NewName(prefix)
	if err := b.Declare(ctx, broker.Subscription{Topic: topic, Group: group}); err != nil {
		_ = b.Close()
		t.Fatalf("declare Kafka topic %s: %v", topic, err)
	}
	sub, err := b.NewSubscriber(group)
	if err != nil {
		_ = b.Close()
		t.Fatalf("Kafka subscriber: %v", err)
	}
	t.Cleanup(func() {
		_ = sub.Close()
		if err := b.DeleteKafkaTopics(topic); err != nil {
			t.Logf("delete Kafka topic %s: %v", topic, err)
		}
		_ = b.Close()
	})
	return topic, sub
}

// ProduceForeign writes records to topic with a plain franz-go producer, not Watermill's: no
// _watermill_message_uuid header unless a record carries one, headers of any bytes. It fails t
// unless every record is acknowledged.
func ProduceForeign(t testing.TB, topic string, records ...*kgo.Record) {
	t.Helper()
	// A topic the test has just created may not be known yet to the broker that leads its
	// partition (CI saw UNKNOWN_TOPIC_OR_PARTITION): retry those until the minute below ends,
	// not franz-go's default 4 times.
	client, err := kgo.NewClient(kgo.SeedBrokers(KafkaBrokers(t)...), kgo.DefaultProduceTopic(topic), kgo.UnknownTopicRetries(-1))
	if err != nil {
		t.Fatalf("franz-go client: %v", err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := client.ProduceSync(ctx, records...).FirstErr(); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}
