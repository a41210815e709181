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
	"github.com/wmonce/watermill-once/pgtx"
)

// watermillSQLVersions are the watermill-sql major versions the SQL broker runs on
// (SQLConfig.WatermillSQL). Every SQL test of this package runs on each.
var watermillSQLVersions = []int{3, 4}

// forEachWatermillSQL runs f in a parallel subtest per watermill-sql version ("v3", "v4").
func forEachWatermillSQL(t *testing.T, f func(t *testing.T, version int)) {
	t.Helper()
	for _, v := range watermillSQLVersions {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			t.Parallel()
			f(t, v)
		})
	}
}

// sqlConfig is brokertest's SQL broker configuration on watermill-sql version.
func sqlConfig(t *testing.T, schema string, version int) broker.Config {
	t.Helper()
	cfg := brokertest.Config(t, broker.SQL, schema)
	cfg.SQL.WatermillSQL = version
	return cfg
}

// TestSQLSubscribeMoreMembersThanPoolConnections subscribes more members of one group than
// the pool has connections before reading from any of them, as Watermill's TestPubSub does
// (TestConcurrentSubscribe, through its subscriber multiplier). The members already subscribed
// hold every connection: one delivers a message nobody reads yet, the others wait for the
// group's offset row lock. Subscribe must not need a connection of its own then; it used to
// (watermill-sql's per-Subscribe offsets transaction) and hung until AckDeadline.
func TestSQLSubscribeMoreMembersThanPoolConnections(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, testSQLSubscribeMoreMembersThanPoolConnections)
}

func testSQLSubscribeMoreMembersThanPoolConnections(t *testing.T, version int) {
	const poolSize, members, n = 3, 6, 20
	db := pgtest.OpenDB(t, poolSize)
	schema := pgtest.Schema(t, pgtest.DB(t))
	cfg := sqlConfig(t, schema, version)
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

// TestSQLWatermillVersionsShareTopicsAndGroups: watermill-sql v3 and v4 read and write the same
// topic and offsets tables, so a deployment can move from one to the other, either way, without
// a migration. Rows published on one version are consumed on the other byte for byte (a binary
// payload, metadata), and a consumer group that acked part of a topic on one version continues
// on the other where it stopped: nothing skipped, nothing delivered again.
func TestSQLWatermillVersionsShareTopicsAndGroups(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ from, to int }{{3, 4}, {4, 3}} {
		t.Run(fmt.Sprintf("v%d-to-v%d", c.from, c.to), func(t *testing.T) {
			t.Parallel()
			db := pgtest.DB(t)
			schema := pgtest.Schema(t, db)
			topic := pgtest.NewName("switch")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			open := func(version int) (*broker.Broker, message.Publisher) {
				cfg := sqlConfig(t, schema, version)
				b, err := broker.New(ctx, db, cfg, watermill.NopLogger{})
				require.NoError(t, err)
				t.Cleanup(func() { _ = b.Close() })
				b.TestSignals().SQLBatchCommit.Init()
				pub, err := b.NewPublisher(ctx)
				require.NoError(t, err)
				t.Cleanup(func() { _ = pub.Close() })
				return b, pub
			}
			newMsg := func(id string) *message.Message {
				m := message.NewMessage(id, []byte{0xff, 0x00, 'x'})
				m.Metadata.Set("note", "naïve ☃")
				return m
			}
			consume := func(b *broker.Broker, group string, want ...string) {
				t.Helper()
				sub, err := b.NewSubscriber(group)
				require.NoError(t, err)
				ch, err := sub.Subscribe(ctx, topic)
				require.NoError(t, err)
				var got []string
				for _, m := range receive(t, ch, len(want), 30*time.Second) {
					got = append(got, m.UUID)
					require.Equal(t, []byte{0xff, 0x00, 'x'}, []byte(m.Payload))
					require.Equal(t, "naïve ☃", m.Metadata.Get("note"))
				}
				require.Equal(t, want, got)
				// receive acked them; the subscription commits the group's offset right after,
				// in the batch that delivered the last one.
				b.TestSignals().SQLBatchCommit.WaitFor(func(g string) bool {
					return g == group && pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "watermill_offsets_"+topic)+
						` o JOIN `+pgtx.QualifiedName(schema, "watermill_"+topic)+` m ON m."offset" = o.offset_acked WHERE o.consumer_group = $1 AND m.uuid = $2`,
						group, want[len(want)-1]) == 1
				})
				require.NoError(t, sub.Close())
			}

			old, oldPub := open(c.from)
			require.NoError(t, oldPub.Publish(topic, newMsg("m-0"), newMsg("m-1")))
			consume(old, "g", "m-0", "m-1")

			next, nextPub := open(c.to)
			require.NoError(t, nextPub.Publish(topic, newMsg("m-2"), newMsg("m-3")))
			consume(next, "g", "m-2", "m-3")                   // where the group stopped on the other version
			consume(next, "fresh", "m-0", "m-1", "m-2", "m-3") // rows of both versions, in order
		})
	}
}
