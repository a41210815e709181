package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// newBroker returns a broker of kind isolated for t, with group subscribed to topics.
func newBroker(t *testing.T, db *sql.DB, schema string, kind broker.Kind, group string, topics ...string) *broker.Broker {
	t.Helper()
	cfg := brokertest.Config(t, kind, schema)
	for _, topic := range topics {
		cfg.Subscriptions = append(cfg.Subscriptions, broker.Subscription{Topic: topic, Group: group})
	}
	b, err := broker.New(context.Background(), db, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	brokertest.DeleteCreatedKafkaTopics(t, b)
	return b
}

// brokerPublisher returns a broker of kind for t, with group subscribed to topic, and its
// publisher.
func brokerPublisher(t *testing.T, db *sql.DB, schema string, kind broker.Kind, group, topic string) (*broker.Broker, message.Publisher) {
	t.Helper()
	b := newBroker(t, db, schema, kind, group, topic)
	pub, err := b.NewPublisher(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return b, pub
}

// subscribe returns the UUIDs group receives on topic, acking each (receiveAt).
func subscribe(t *testing.T, b *broker.Broker, group, topic string) <-chan string {
	t.Helper()
	in := receiveAt(t, b, group, topic)
	out := make(chan string, 64)
	go func() {
		for p := range in {
			out <- p.uuid
		}
	}()
	return out
}

func receiveN(t *testing.T, ch <-chan string, n int, what string) []string {
	t.Helper()
	got := make([]string, 0, n)
	for len(got) < n {
		got = append(got, testwait.Receive(t, ch, what))
	}
	return got
}

func publishMsgs(t *testing.T, db *sql.DB, w *outbox.Writer, topic string, msgs ...*message.Message) {
	t.Helper()
	require.NoError(t, pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return w.PublishTx(ctx, tx, topic, msgs...)
	}))
}

func keyed(uuid, key string) *message.Message {
	m := message.NewMessage(uuid, []byte(`{}`))
	m.Metadata.Set("partition_key", key)
	return m
}

// Through the broker package's publisher, on every broker: rows the broker can never carry as
// they are (a topic name it refuses; on Kafka also a metadata key Watermill reserves and a
// record above the producer's size limit) are set aside in outbox_rejected with the broker's
// reason, and the rows behind them go on, the later rows of the same key included.
func TestRelaySetsAsideWhatTheBrokerRefuses(t *testing.T) {
	t.Parallel()
	for _, kind := range []broker.Kind{broker.Kafka, broker.AMQP, broker.SQL} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			db := pgtest.DB(t)
			schema := pgtest.Schema(t, db)
			topic := pgtest.NewName("orders")
			b, pub := brokerPublisher(t, db, schema, kind, "g", topic)
			received := subscribe(t, b, "g", topic)

			w, err := outbox.NewWriter(outbox.Config{Schema: schema}) // the default topic rule: any broker's topics pass
			require.NoError(t, err)
			want := []string{"k-1"}
			refused := map[string]string{"bad-topic": "not valid for"}
			publishMsgs(t, db, w, topic, keyed("k-1", "k"))
			publishMsgs(t, db, w, "bad!topic", keyed("bad-topic", "k"))
			if kind == broker.Kafka {
				reserved := keyed("reserved", "k")
				reserved.Metadata.Set("_watermill_message_uuid", "spoofed")
				big := keyed("big", "k")
				big.Payload = []byte(strings.Repeat("x", 1_100_000)) // above Sarama's Producer.MaxMessageBytes (1,000,000)
				publishMsgs(t, db, w, topic, keyed("k-2", "k"), reserved, keyed("k-3", "k"))
				publishMsgs(t, db, w, topic, big)
				want = append(want, "k-2", "k-3")
				refused["reserved"] = "reserved by watermill"
				refused["big"] = "larger than configured Producer.MaxMessageBytes"
			}
			publishMsgs(t, db, w, topic, keyed("k-last", "k"))
			want = append(want, "k-last")

			r, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema}, nil)
			require.NoError(t, err)
			relayOnce(t, r)
			require.Equal(t, want, receiveN(t, received, len(want), "the rows the broker accepts, in order"))
			rejected, err := outboxops.ListRejected(context.Background(), db, schema, outboxops.RejectedFilter{}, 10, false)
			require.NoError(t, err)
			require.Len(t, rejected, len(refused))
			for _, row := range rejected {
				require.Contains(t, row.LastError, refused[row.UUID], "row %s", row.UUID)
			}
			require.Equal(t, uint64(len(refused)), r.Counters().Rejected)
			require.Zero(t, r.Counters().HeldTopics)
		})
	}
}

// On a real Kafka cluster that creates no topics by itself (e2e/services sets
// auto.create.topics.enable=false), a topic that does not exist holds back its own rows only,
// with an error naming it: the rows of the other topic are published meanwhile, and the held
// rows follow, in order, once the topic exists. The publisher is watermill-kafka's own, which
// (unlike the broker package's) does not create topics.
func TestRelayOnKafkaHoldsBackOnlyAMissingTopic(t *testing.T) {
	t.Parallel()
	addrs := brokertest.RealKafka()
	if addrs == nil {
		t.Skipf("needs a Kafka cluster that does not create topics on demand (the embedded kfake broker does): run with %s=127.0.0.1:9092 (or 127.0.0.1:9094), brokers started by e2e/services", broker.EnvKafkaBrokers)
	}
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	orders, missing := pgtest.NewName("orders"), pgtest.NewName("missing")
	b := newBroker(t, db, schema, broker.Kafka, "g", orders) // creates orders, not missing
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_1_0_0
	sc.Producer.Return.Successes = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Metadata.Retry.Max, sc.Metadata.Retry.Backoff = 2, 100*time.Millisecond
	// Keyed records, as the relay's per-key order needs: one partition for key "k".
	marshaler := kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.Metadata.Get("partition_key"), nil
	})
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: addrs, Marshaler: marshaler, OverwriteSaramaConfig: sc}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	publishMsgs(t, db, w, missing, keyed("m-1", "k"))
	publishMsgs(t, db, w, orders, keyed("o-1", "k"))
	publishMsgs(t, db, w, missing, keyed("m-2", "k"))
	publishMsgs(t, db, w, orders, keyed("o-2", "k"))
	logger := watermill.NewCaptureLogger()
	r, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema, Backoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}, logger)
	require.NoError(t, err)
	sig := startRelay(t, r)

	require.Equal(t, []string{"o-1", "o-2"}, receiveN(t, subscribe(t, b, "g", orders), 2, "the other topic's rows while one topic is missing"))
	require.Equal(t, 1, r.Counters().HeldTopics)
	var named bool
	for _, m := range logger.Captured()[watermill.ErrorLogLevel] {
		named = named || m.Fields["topic"] == missing && strings.Contains(m.Msg, "holds topic")
	}
	require.True(t, named, "an error log names the held topic")

	require.NoError(t, b.Declare(context.Background(), broker.Subscription{Topic: missing, Group: "h"}))
	require.Equal(t, []string{"m-1", "m-2"}, receiveN(t, subscribe(t, b, "h", missing), 2, "the held rows once the topic exists, in order"))
	require.Equal(t, missing, sig.TopicReleased.WaitOrTimeout())
	require.Zero(t, r.Counters().HeldTopics)
}
