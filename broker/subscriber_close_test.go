package broker_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TestSubscriberCloseClosesItsChannels checks what Watermill's TestPubSub checks after every
// Close (TestPublishSubscribe: the channel must be closed once Close returns), many times over,
// for each broker. watermill-sql's Close returned just before its consume goroutine closed the
// channel, which the suite caught about once in twenty runs.
func TestSubscriberCloseClosesItsChannels(t *testing.T) {
	t.Parallel()
	for _, kind := range broker.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			topic := pgtest.NewName("closing")
			b := newBroker(t, kind, broker.Subscription{Topic: topic, Group: "g"})
			rounds := 200
			if kind != broker.SQL {
				rounds = 10 // each round is a RabbitMQ connection or a Kafka group join
			}
			for i := range rounds {
				sub, err := b.NewSubscriber("g")
				require.NoError(t, err)
				ch, err := sub.Subscribe(context.Background(), topic)
				require.NoError(t, err)
				require.NoError(t, sub.Close())
				select {
				case _, open := <-ch:
					require.False(t, open, "round %d: a message arrived after Close", i)
				default:
					t.Fatalf("round %d: the channel is still open after Close returned", i)
				}
			}
		})
	}
}

// A router closes a subscriber shared by several handlers once per handler, concurrently.
func TestSubscriberCloseIsSafeConcurrently(t *testing.T) {
	t.Parallel()
	for _, kind := range []broker.Kind{broker.SQL, broker.AMQP} {
		t.Run(string(kind), func(t *testing.T) {
			topic := pgtest.NewName("closing")
			b := newBroker(t, kind, broker.Subscription{Topic: topic, Group: "g"})
			sub, err := b.NewSubscriber("g")
			require.NoError(t, err)
			_, err = sub.Subscribe(context.Background(), topic)
			require.NoError(t, err)
			var wg sync.WaitGroup
			for range 4 {
				wg.Add(1)
				go func() { defer wg.Done(); require.NoError(t, sub.Close()) }()
			}
			wg.Wait()
		})
	}
}
