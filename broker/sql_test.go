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

// TestSQLSubscribeMoreMembersThanPoolConnections subscribes more members of one group than
// the pool has connections before reading from any of them, as Watermill's TestPubSub does
// (TestConcurrentSubscribe, through its subscriber multiplier). The members already subscribed
// hold every connection: one delivers a message nobody reads yet, the others wait for the
// group's offset row lock. Subscribe must not need a connection of its own then; it used to
// (watermill-sql's per-Subscribe offsets transaction) and hung until AckDeadline.
func TestSQLSubscribeMoreMembersThanPoolConnections(t *testing.T) {
	t.Parallel()
	const poolSize, members, n = 3, 6, 20
	db := pgtest.OpenDB(t, poolSize)
	schema := pgtest.Schema(t, pgtest.DB(t))
	cfg := brokertest.Config(t, broker.SQL, schema)
	topic := pgtest.NewName("members")
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "g"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.New(ctx, db, cfg, watermill.NopLogger{})
	require.NoError(t, err)
	defer b.Close()
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	for i := range n {
		require.NoError(t, pub.Publish(topic, message.NewMessage(fmt.Sprintf("m-%d", i), []byte("x"))))
	}

	type result struct {
		subs  []message.Subscriber
		chans []<-chan *message.Message
		err   error
	}
	subscribed := make(chan result, 1)
	go func() {
		var r result
		for range members {
			sub, err := b.NewSubscriber("g")
			if err != nil {
				r.err = err
				break
			}
			r.subs = append(r.subs, sub)
			ch, err := sub.Subscribe(ctx, topic)
			if err != nil {
				r.err = err
				break
			}
			r.chans = append(r.chans, ch)
		}
		subscribed <- r
	}()
	var chans []<-chan *message.Message
	select {
	case r := <-subscribed:
		for _, sub := range r.subs {
			defer sub.Close()
		}
		require.NoError(t, r.err)
		chans = r.chans
	case <-time.After(10 * time.Second):
		t.Fatalf("subscribing %d members of one group on a pool of %d connections did not return within 10s", members, poolSize)
	}
	require.Len(t, chans, members)

	merged := make(chan *message.Message)
	for _, ch := range chans {
		go func() {
			for m := range ch {
				select {
				case merged <- m:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	got := map[string]bool{}
	for _, m := range receive(t, merged, n, 30*time.Second) {
		got[m.UUID] = true
	}
	require.Len(t, got, n, "every message once, in a clean run")
}
