package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

func newBroker(t *testing.T, kind broker.Kind, subs ...broker.Subscription) *broker.Broker {
	t.Helper()
	return newBrokerWith(t, kind, nil, subs...)
}

// newBrokerWith is newBroker with the configuration changed by tweak first.
func newBrokerWith(t *testing.T, kind broker.Kind, tweak func(*broker.Config), subs ...broker.Subscription) *broker.Broker {
	t.Helper()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	cfg := brokertest.Config(t, kind, schema)
	cfg.Subscriptions = subs
	if tweak != nil {
		tweak(&cfg)
	}
	b, err := broker.New(context.Background(), db, cfg, watermill.NewStdLogger(false, false))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	brokertest.DeleteCreatedKafkaTopics(t, b)
	return b
}

// receive reads n messages, acking each, or fails at the deadline.
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

// TestRoundTrip checks, for each broker, what the rest of the project relies on: messages
// published before the group first subscribes are delivered (declared subscriptions, oldest
// offset), UUID and metadata survive, payloads need not be JSON, and messages with one
// partition key arrive in the order they were published.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, kind := range broker.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			topic := pgtest.NewName("orders")
			// RabbitMQ keeps queue order only with one message in flight per subscription
			// (the default Workers 8 finishes messages in any order).
			oneAtATime := func(c *broker.Config) { c.AMQP.Workers = 1 }
			b := newBrokerWith(t, kind, oneAtATime, broker.Subscription{Topic: topic, Group: "billing"})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()

			pub, err := b.NewPublisher(ctx)
			require.NoError(t, err)
			defer pub.Close()
			const n = 30
			for i := range n {
				msg := message.NewMessage(fmt.Sprintf("evt-%02d-%s", i, watermill.NewUUID()), []byte{0xff, 0x00, byte(i)})
				msg.Metadata.Set("partition_key", fmt.Sprintf("customer-%d", i%3))
				msg.Metadata.Set("seq", fmt.Sprint(i))
				require.NoError(t, pub.Publish(topic, msg))
			}

			sub, err := b.NewSubscriber("billing")
			require.NoError(t, err)
			defer sub.Close()
			ch, err := sub.Subscribe(ctx, topic)
			require.NoError(t, err)
			got := receive(t, ch, n, 45*time.Second)

			lastSeq := map[string]int{}
			seen := map[string]bool{}
			for _, m := range got {
				require.Len(t, m.UUID, len("evt-00-")+36, "UUID travels unchanged: %q", m.UUID)
				require.False(t, seen[m.UUID], "no copy in a clean run")
				seen[m.UUID] = true
				var seq int
				_, err := fmt.Sscan(m.Metadata.Get("seq"), &seq)
				require.NoError(t, err)
				require.Equal(t, []byte{0xff, 0x00, byte(seq)}, []byte(m.Payload), "binary payload intact")
				key := m.Metadata.Get("partition_key")
				if prev, ok := lastSeq[key]; ok {
					require.Greater(t, seq, prev, "messages of %s out of order", key)
				}
				lastSeq[key] = seq
			}
			require.Len(t, lastSeq, 3)
		})
	}
}

// TestTwoGroupsEachGetEverythingMembersShare checks consumer-group semantics: two groups
// both receive every message; two members of one group split them without loss.
func TestTwoGroupsEachGetEverythingMembersShare(t *testing.T) {
	t.Parallel()
	for _, kind := range broker.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			topic := pgtest.NewName("payments")
			b := newBroker(t, kind, broker.Subscription{Topic: topic, Group: "rewards"}, broker.Subscription{Topic: topic, Group: "notifications"})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			pub, err := b.NewPublisher(ctx)
			require.NoError(t, err)
			defer pub.Close()
			const n = 20
			for i := range n {
				require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("m-%d", i), []byte("{}"))))
			}

			type delivery struct{ group, uuid string }
			deliveries := make(chan delivery)
			for _, member := range []struct{ group, name string }{{"rewards", "a"}, {"rewards", "b"}, {"notifications", "a"}} {
				sub, err := b.NewSubscriber(member.group)
				require.NoError(t, err)
				defer sub.Close()
				ch, err := sub.Subscribe(ctx, topic)
				require.NoError(t, err)
				go func() {
					for m := range ch {
						select {
						case deliveries <- delivery{member.group, m.UUID}:
							m.Ack()
						case <-ctx.Done():
							m.Nack()
						}
					}
				}()
			}
			got := map[string]map[string]bool{"rewards": {}, "notifications": {}}
			deadline := time.After(45 * time.Second) // a Kafka group rebalance can take most of it
			for len(got["rewards"]) < n || len(got["notifications"]) < n {
				select {
				case d := <-deliveries:
					got[d.group][d.uuid] = true
				case <-deadline:
					t.Fatalf("each group should receive all %d messages: rewards got %d, notifications %d", n, len(got["rewards"]), len(got["notifications"]))
				}
			}
			cancel()
		})
	}
}
