package outbox_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// published is one message a publisher accepted, and when.
type published struct {
	uuid string
	at   time.Time
	md   message.Metadata
}

// clockSink records every message published with the time its Publish call was made, and
// sends it on got.
type clockSink struct {
	next message.Publisher // nil: accept everything
	got  chan published
	mu   sync.Mutex
	fail map[string]bool // topics refused (transiently)
}

func newClockSink(next message.Publisher) *clockSink {
	return &clockSink{next: next, got: make(chan published, 100), fail: map[string]bool{}}
}

func (s *clockSink) Publish(topic string, msgs ...*message.Message) error {
	at := time.Now()
	s.mu.Lock()
	failing := s.fail[topic]
	s.mu.Unlock()
	if failing {
		return errTransient
	}
	if s.next != nil {
		if err := s.next.Publish(topic, msgs...); err != nil {
			return err
		}
	}
	for _, m := range msgs {
		s.got <- published{uuid: m.UUID, at: at, md: m.Metadata}
	}
	return nil
}
func (s *clockSink) Close() error { return nil }

func (s *clockSink) failTopic(topic string, failing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[topic] = failing
}

type transientError struct{}

func (transientError) Error() string { return "broker unavailable" }

var errTransient error = transientError{}

func storeAt(t *testing.T, db *sql.DB, w *outbox.Writer, at time.Time, topic string, msgs ...*message.Message) {
	t.Helper()
	require.NoError(t, pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return w.PublishTxAt(ctx, tx, at, topic, msgs...)
	}))
}

func dueOf(t *testing.T, md message.Metadata) time.Time {
	t.Helper()
	due, ok, err := outboxops.DueAt(md)
	require.NoError(t, err)
	require.True(t, ok, "the message carries %s", outbox.MetadataDelayedUntil)
	return due
}

// A delayed message is stored at once and published when due, not before, by the relay's own
// timer: its PollInterval is an hour, so only the timer for the earliest due row can wake it.
// Meanwhile it holds back nothing: the later message of its key and one of another key go
// first (the order rule, package doc: a delay is a time, not a place in line).
func TestRelayPublishesADelayedMessageWhenDue(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	sink := newClockSink(nil)
	r, err := outbox.NewRelay(db, sink, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour}, nil)
	require.NoError(t, err)
	sig := startRelay(t, r)
	sig.Leading.WaitOrTimeout()

	due := time.Now().Add(2 * time.Second) // the margin for the others to go first
	storeAt(t, db, w, due, "orders", keyed("late", "k"))
	publishMsgs(t, db, w, "orders", keyed("k-next", "k"), keyed("other", "j"))

	first, second := testwait.Receive(t, sink.got, "the messages not delayed"), testwait.Receive(t, sink.got, "the messages not delayed")
	require.Equal(t, []string{"k-next", "other"}, []string{first.uuid, second.uuid})
	require.True(t, first.at.Before(due), "the later message of the key went first, while the delayed one waited")

	late := testwait.Receive(t, sink.got, "the delayed message, when due")
	require.Equal(t, "late", late.uuid)
	require.False(t, late.at.Before(due), "published at %s, due at %s", late.at.Format(time.RFC3339Nano), due.Format(time.RFC3339Nano))
	require.Equal(t, due.UTC().Format(time.RFC3339Nano), late.md.Get(outbox.MetadataDelayedUntil), "the delay metadata travels on")
	require.Equal(t, uint64(1), r.Counters().Delayed)
	// The relay counts a publish, and removes the row from outbox_delayed, after the publisher
	// returned.
	testwait.Until(t, "the delayed row to be counted and gone", func() bool {
		relays, _, err := outbox.Stats(context.Background(), db, schema)
		require.NoError(t, err)
		require.Len(t, relays, 1)
		require.Zero(t, relays[0].Backlog)
		return r.Counters().Forwarded == 3 && relays[0].Delayed == 0
	})
}

// Watermill's own delay metadata (components/delay, RFC 3339 to the second) delays a message
// as PublishTxAt does; Stats counts it while it waits, apart from the backlog, and a relay that
// starts later (another session: the timer is read from outbox_delayed) publishes it when due.
func TestRelayHonoursWatermillDelayMetadataAcrossARestart(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	msg := keyed("delayed", "k")
	delay.Message(msg, delay.Until(time.Now().Add(1500*time.Millisecond)))
	publishMsgs(t, db, w, "orders", msg)
	due := dueOf(t, msg.Metadata)

	sink := newClockSink(nil)
	first, err := outbox.NewRelay(db, sink, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	require.Equal(t, 1, relayOnce(t, first), "the row is read and set aside")
	relays, _, err := outbox.Stats(context.Background(), db, schema)
	require.NoError(t, err)
	require.Equal(t, int64(1), relays[0].Delayed)
	require.True(t, relays[0].NextDue.Equal(due), "NextDue %s, due %s", relays[0].NextDue, due)
	require.Zero(t, relays[0].Backlog, "a row waiting for its time is not backlog")
	// Retention may delete the outbox row now: the relay's position has passed it.
	n, err := outbox.Prune(context.Background(), db, schema, pgtx.PruneRequest{Before: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	second, err := outbox.NewRelay(db, sink, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour}, nil)
	require.NoError(t, err)
	startRelay(t, second)
	got := testwait.Receive(t, sink.got, "the delayed message, published by the relay that started later")
	require.Equal(t, "delayed", got.uuid)
	require.False(t, got.at.Before(due), "published at %s, due at %s", got.at, due)
}

// A delayed message whose topic fails when it falls due joins the topic's held rows: it is
// published, in order behind them, once the topic accepts messages again.
func TestRelayHoldsADueMessageOfAFailingTopic(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	sink := newClockSink(nil)
	sink.failTopic("orders", true)
	r, err := outbox.NewRelay(db, sink, outbox.RelayConfig{Schema: schema, Backoff: time.Millisecond, MaxBackoff: time.Millisecond}, nil)
	require.NoError(t, err)
	due := time.Now().Add(100 * time.Millisecond)
	storeAt(t, db, w, due, "orders", keyed("late", "k"))
	require.Equal(t, 1, relayOnce(t, r))
	testwait.Until(t, "the due message to be held", func() bool { relayOnce(t, r); return r.Counters().Held == 1 })
	require.Empty(t, sink.got)

	sink.failTopic("orders", false)
	testwait.Until(t, "the held message to be published", func() bool { relayOnce(t, r); return len(sink.got) == 1 })
	got := <-sink.got
	require.Equal(t, "late", got.uuid)
	require.False(t, got.at.Before(due))
}

func TestPublishTxRefusesUnreadableDelayMetadata(t *testing.T) {
	t.Parallel()
	db, _, w := setup(t)
	msg := keyed("bad", "k")
	msg.Metadata.Set(outbox.MetadataDelayedUntil, "tomorrow")
	err := pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return w.PublishTx(ctx, tx, "orders", msg)
	})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.ErrorContains(t, err, "is not an RFC 3339 time")
}

// On every broker: the delayed message reaches the consumer after it is due, and after the
// later message of its key, which the delay did not hold back.
func TestRelayDelaysOnEveryBroker(t *testing.T) {
	t.Parallel()
	for _, kind := range []broker.Kind{broker.Kafka, broker.AMQP, broker.SQL} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			db := pgtest.DB(t)
			schema := pgtest.Schema(t, db)
			topic := pgtest.NewName("orders")
			b, pub := brokerPublisher(t, db, schema, kind, "g", topic)
			received := receiveAt(t, b, "g", topic)
			w, err := outbox.NewWriter(outbox.Config{Schema: schema})
			require.NoError(t, err)
			sink := newClockSink(pub)
			r, err := outbox.NewRelay(db, sink, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour}, nil)
			require.NoError(t, err)
			startRelay(t, r).Leading.WaitOrTimeout()

			due := time.Now().Add(2 * time.Second) // the margin for k-next to go first
			storeAt(t, db, w, due, topic, keyed("late", "k"))
			publishMsgs(t, db, w, topic, keyed("k-next", "k"))

			next := testwait.Receive(t, received, "the later message of the key")
			require.Equal(t, "k-next", next.uuid)
			late := testwait.Receive(t, received, "the delayed message")
			require.Equal(t, "late", late.uuid)
			require.False(t, late.at.Before(due), "received at %s, due at %s", late.at, due)
			pubAt := (<-sink.got).at
			if pubAt.Before(due) { // the first one recorded is k-next's
				pubAt = (<-sink.got).at
			}
			require.False(t, pubAt.Before(due), "published at %s, due at %s", pubAt, due)
		})
	}
}

// receiveAt returns what group receives on topic, with the time each arrived, acking each.
func receiveAt(t *testing.T, b *broker.Broker, group, topic string) <-chan published {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := b.NewSubscriber(group)
	require.NoError(t, err)
	t.Cleanup(func() { cancel(); _ = sub.Close() })
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	out := make(chan published, 64)
	go func() {
		defer close(out)
		for m := range msgs {
			out <- published{uuid: m.UUID, at: time.Now(), md: m.Metadata}
			m.Ack()
		}
	}()
	return out
}

// Watermill's delay publisher (components/delay) in front of the Writer's publishers sets the
// metadata from the message context, and the relay delays the message accordingly.
func TestWatermillDelayPublisherInFrontOfTheWriter(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	pub, err := delay.NewPublisher(w.DBPublisher(db), delay.PublisherConfig{AllowNoDelay: true})
	require.NoError(t, err)
	msg := keyed("later", "k")
	msg.SetContext(delay.WithContext(context.Background(), delay.For(time.Hour)))
	require.NoError(t, pub.Publish("orders", msg, keyed("now", "k")))

	sink := newClockSink(nil)
	r, err := outbox.NewRelay(db, sink, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	require.Equal(t, 2, relayOnce(t, r))
	require.Equal(t, "now", (<-sink.got).uuid)
	require.Empty(t, sink.got)
	relays, _, err := outbox.Stats(context.Background(), db, schema)
	require.NoError(t, err)
	require.Equal(t, int64(1), relays[0].Delayed)
}
