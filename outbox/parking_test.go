package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// refusedMessages are messages a consumer refuses and DBPublisher cannot store as they are,
// each one of the ways a foreign producer's message can be unstorable, and some that would
// make a naive encoding ambiguous.
func refusedMessages() map[string]*message.Message {
	msg := func(uuid string, payload string, md ...string) *message.Message {
		m := message.NewMessage(uuid, []byte(payload))
		for i := 0; i < len(md); i += 2 {
			m.Metadata.Set(md[i], md[i+1])
		}
		return m
	}
	return map[string]*message.Message{
		"empty UUID":                        msg("", "p", "event_id", "e-1"),
		"UUID longer than MaxUUIDLength":    msg(strings.Repeat("u", outbox.MaxUUIDLength+1), "p"),
		"UUID not UTF-8":                    msg("abc\xff", "p"),
		"UUID with NUL":                     msg("a\x00b", "p"),
		"metadata value not UTF-8":          msg("m-1", "p", "trace", "abc\xff", "plain", "kept"),
		"metadata value with NUL":           msg("m-2", "p", "note", "a\x00b"),
		"metadata key not UTF-8":            msg("m-3", "p", "k\xff", "v"),
		"Watermill's reserved UUID key":     msg("m-4", "p", "_watermill_message_uuid", "other-id"),
		"RabbitMQ's reserved CC and BCC":    msg("m-7", "p", "CC", `["q1"]`, "BCC", "q2"),
		"binary payload and binary header":  msg("", "\xff\x00\xfe", "h", "\x00\x01"),
		"key with a comma":                  msg("m-5", "p", "a,b", "\xff"),
		"keys mistakable for markers":       msg("", "p", "uuid_missing", "no", "metadata_base64_keys", "x", "base64:Zm9v", "y", "uuid_original_base64", "z"),
		"encoded name of another key taken": msg("m-6", "p", "_watermill_message_uuid", "u", "base64:X3dhdGVybWlsbF9tZXNzYWdlX3V1aWQ=", "taken"),
	}
}

// Parkable changes only what cannot travel as it is, and RecoverParked gives back exactly what
// it was given; a message that can travel is returned itself, and a parkable copy is not
// changed again.
func TestParkableRoundTrips(t *testing.T) {
	t.Parallel()
	for name, m := range refusedMessages() {
		t.Run(name, func(t *testing.T) {
			original := m.Copy()
			p := outbox.Parkable(m)
			require.NotSame(t, m, p)
			require.Equal(t, original.UUID, m.UUID, "the message itself is not changed")
			require.Equal(t, original.Metadata, m.Metadata, "the message itself is not changed")
			require.True(t, travels(p), "parkable: %q %q", p.UUID, p.Metadata)
			require.Same(t, p, outbox.Parkable(p), "a parkable copy needs no second change")

			back, err := outbox.RecoverParked(p)
			require.NoError(t, err)
			require.Equal(t, original.UUID, back.UUID)
			require.Equal(t, original.Payload, back.Payload)
			require.Equal(t, original.Metadata, back.Metadata)
		})
	}

	fine := message.NewMessage("e-1", []byte("\xff"))
	fine.Metadata.Set("note", "naïve ☃")
	require.Same(t, fine, outbox.Parkable(fine))
	back, err := outbox.RecoverParked(fine)
	require.NoError(t, err)
	require.Equal(t, fine.Metadata, back.Metadata)

	bad := message.NewMessage("e-2", nil)
	bad.Metadata.Set("metadata_base64_keys", "not json")
	_, err = outbox.RecoverParked(bad)
	require.ErrorIs(t, err, outbox.ErrNotParked)
}

// travels reports whether the outbox stores m as it is, Watermill's Kafka marshaler takes it,
// and RabbitMQ does (it nacks a string CC or BCC header: TestParkedCopiesCrossRabbitMQ).
func travels(m *message.Message) bool {
	_, err := kafka.DefaultMarshaler{}.Marshal("t", m)
	return err == nil && m.UUID != "" && len(m.UUID) <= outbox.MaxUUIDLength && text(m.UUID) && func() bool {
		for k, v := range m.Metadata {
			if !text(k) || !text(v) || k == "CC" || k == "BCC" {
				return false
			}
		}
		return true
	}()
}

func text(s string) bool { return strings.ToValidUTF8(s, "") == s && !strings.Contains(s, "\x00") }

// kafkaWire is a publisher that turns every message into the Kafka record Watermill's marshaler
// would send and back, as a consumer of the poison topic would see it; a message the marshaler
// refuses fails the publish, as it would fail (and block) the relay, and is recorded and calls
// stop, since the relay retries it for as long as its context lasts.
type kafkaWire struct {
	mu      sync.Mutex
	got     []*message.Message
	refused error
	stop    func()
}

func (k *kafkaWire) Publish(topic string, msgs ...*message.Message) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, m := range msgs {
		rec, err := kafka.DefaultMarshaler{}.Marshal(topic, m)
		if err != nil {
			k.refused = err
			k.stop()
			return err
		}
		value, _ := rec.Value.Encode()
		in := &sarama.ConsumerMessage{Topic: topic, Value: value}
		for _, h := range rec.Headers {
			in.Headers = append(in.Headers, &sarama.RecordHeader{Key: h.Key, Value: h.Value})
		}
		out, err := kafka.DefaultMarshaler{}.Unmarshal(in)
		if err != nil {
			return err
		}
		k.got = append(k.got, out)
	}
	return nil
}

func (k *kafkaWire) Close() error { return nil }

func (k *kafkaWire) all() []*message.Message {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*message.Message(nil), k.got...)
}

// Everything a consumer can refuse for its UUID or metadata, DBPublisher refuses to store, so a
// poison queue writing through it could never park it (the message was nacked forever).
// ParkingPublisher stores each one, the relay forwards it through Watermill's Kafka marshaler
// without a refusal, and the original comes back from the poison topic byte for byte.
func TestParkingPublisherParksWhatDBPublisherRefuses(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	for name, m := range refusedMessages() {
		require.False(t, travels(m), "%s: refused by the outbox or by a broker", name)
		if !strings.Contains(name, "reserved") && !strings.Contains(name, "taken") { // text, but not for the brokers
			require.ErrorIs(t, w.DBPublisher(db).Publish("poison", m), outbox.ErrInvalidMessage, name)
		}
	}
	originals := parkAll(t, db, w)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wire := &kafkaWire{stop: cancel}
	r, err := outbox.NewRelay(db, wire, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	for len(wire.all()) < len(originals) {
		n, err := r.RelayOnce(ctx)
		wire.mu.Lock()
		refused := wire.refused
		wire.mu.Unlock()
		require.NoError(t, refused, "Watermill's Kafka marshaler refused a parked copy: the relay would retry it forever")
		require.NoError(t, err)
		require.NotZero(t, n, "the relay has nothing left to do, and forwarded %d of %d parked messages", len(wire.all()), len(originals))
	}
	require.Len(t, wire.all(), len(originals))
	for _, got := range wire.all() {
		requireOriginal(t, originals, got, nil)
	}
}

// parkAll parks every refusedMessages case through w's ParkingPublisher, each marked with its
// name in "case" metadata, and returns the originals by name.
func parkAll(t *testing.T, db *sql.DB, w *outbox.Writer) map[string]*message.Message {
	t.Helper()
	originals := map[string]*message.Message{}
	for name, m := range refusedMessages() {
		m.Metadata.Set("case", name)
		originals[name] = m.Copy()
		require.NoError(t, w.ParkingPublisher(db).Publish("poison", m), name)
	}
	return originals
}

// requireOriginal checks that the parked copy got gives back its original byte for byte, the
// Writer's stamps not added, and returns the case's name. Metadata the broker adds on the way
// out (brokerAdded; nil: none) is left aside.
func requireOriginal(t *testing.T, originals map[string]*message.Message, got *message.Message, brokerAdded func(key string) bool) string {
	t.Helper()
	back, err := outbox.RecoverParked(got)
	require.NoError(t, err)
	name := back.Metadata.Get("case")
	want, ok := originals[name]
	require.True(t, ok, "case %q", name)
	require.Equal(t, want.UUID, back.UUID, name)
	require.Equal(t, want.Payload, back.Payload, name)
	for k := range back.Metadata {
		if _, original := want.Metadata[k]; !original && brokerAdded != nil && brokerAdded(k) {
			delete(back.Metadata, k)
		}
	}
	require.Equal(t, want.Metadata, back.Metadata, name)
	return name
}

// The parking publisher still refuses what is no message's fault, without writing anything.
func TestParkingPublisherRefusesBadTopicAndNilDB(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	require.ErrorContains(t, w.ParkingPublisher(nil).Publish("poison", message.NewMessage("", nil)), "ParkingPublisher: db is nil")
	require.ErrorIs(t, w.ParkingPublisher(db).Publish("bad topic", message.NewMessage("", nil)), outbox.ErrInvalidMessage)
	require.ErrorIs(t, w.CheckTopic("bad topic"), outbox.ErrInvalidMessage)
	require.NoError(t, w.CheckTopic("wmonce.poison"))
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")).Scan(&n))
	require.Zero(t, n)
}

// The same parked copies through a real RabbitMQ: the relay's publishes are confirmed (a
// string CC or BCC header used to be nacked, blocking the relay), and the originals come back.
func TestParkedCopiesCrossRabbitMQ(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	originals := parkAll(t, db, w)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := broker.New(ctx, nil, brokertest.Config(t, broker.AMQP, schema), nil)
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.Declare(ctx, broker.Subscription{Topic: "poison", Group: "ops"}))
	pub, sub, err := b.NewPubSub(ctx, "ops")
	require.NoError(t, err)
	defer pub.Close()
	defer sub.Close()
	r, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	go func() { _ = r.Run(ctx) }()
	defer r.Close()
	parked, err := sub.Subscribe(ctx, "poison")
	require.NoError(t, err)
	// A refused publish is retried with the rest of its batch: copies of the others may arrive
	// again (at least once), the refused one never.
	seen := map[string]bool{}
	for len(seen) < len(originals) {
		got := testwait.Receive(t, parked, fmt.Sprintf("parked copy %d of %d from RabbitMQ (a refused publish blocks the relay)", len(seen)+1, len(originals)))
		got.Ack()
		seen[requireOriginal(t, originals, got, amqpProperty)] = true
	}
}

// amqpProperty reports the metadata under which the broker package's AMQP subscriber exposes a
// delivery's properties (broker.MetadataAMQPMessageID, ...).
func amqpProperty(key string) bool { return strings.HasPrefix(key, "amqp_") }

// A message refused again after a lost ack is parked again: its copy's UUID must be the same, so
// a consumer of the poison topic can deduplicate the two.
func TestParkedUUIDIsTheSameForEveryCopy(t *testing.T) {
	t.Parallel()
	refused := func() *message.Message {
		m := message.NewMessage("", []byte("p"))
		m.Metadata.Set("topic_poisoned", "payments")
		m.Metadata.Set("handler_poisoned", "rewards")
		return m
	}
	a, b := outbox.Parkable(refused()), outbox.Parkable(refused())
	require.Equal(t, a.UUID, b.UUID)
	require.Len(t, a.UUID, 36, "fits watermill-sql's uuid column")
	other := refused()
	other.Payload = []byte("q")
	require.NotEqual(t, a.UUID, outbox.Parkable(other).UUID, "another message, another UUID")
}
