package inbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
)

// The case on a real Kafka broker. A Receiver keyed by a header, behind the poison
// queue the package doc prescribes, gets records from a producer that is not Watermill: one
// without the key header (and so without a UUID, and with a binary payload), one whose key
// header is binary, one with a binary header beside a good key. Each is refused, parked through
// ParkingPublisher and acked, so the record behind them in the one partition is stored; the
// relay forwards the parked copies to Kafka, which takes them, and the originals come back
// from the poison topic byte for byte.
//
// With DBPublisher as the poison publisher (what the docs said before), DBPublisher refused to
// store each of them (empty UUID, binary metadata): the poison publish failed, the record was
// nacked and redelivered forever, and the partition stopped.
func TestReceiverRefusalsAreParkedOnKafka(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	writer, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	receiver := e.receiver(t, inbox.ReceiverConfig{Consumer: "ledger", Key: wmonce.KeyFromMetadata("event_id")})
	stored := &receiverSignals(receiver).BatchCommitted
	topic, sub := brokertest.OnePartitionKafka(t, "inbox_refused", "ledger")
	poisonTopic := pgtest.NewName("inbox_parked")

	poison, err := wmiddleware.PoisonQueueWithFilter(writer.ParkingPublisher(e.db), poisonTopic, wmonce.IsPermanent)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, logger())
	require.NoError(t, err)
	router.AddConsumerHandler("ledger-inbox", topic, sub, receiver.Handle).AddMiddleware(poison)
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	t.Cleanup(func() { _ = router.Close() })

	header := func(kv ...string) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			hs = append(hs, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return hs
	}
	refused := []*kgo.Record{
		{Value: []byte("\xff\x00 no key"), Headers: header("source", "legacy")},
		{Value: []byte("binary key"), Headers: header("event_id", "\xff\xfe")},
		{Value: []byte("binary header"), Headers: header("event_id", "e-2", "signature", "\x00\x9f\xff")},
	}
	good := &kgo.Record{Value: []byte("good"), Headers: header("event_id", "e-good")}
	brokertest.ProduceForeign(t, topic, append(refused, good)...)

	stored.WaitFor(func(b inbox.CommittedBatch) bool { return b.Stored == 1 }) // the record behind the refused ones
	c := receiver.Counters()
	require.Equal(t, uint64(len(refused)), c.Refused, "each refused once: parked at the first refusal, not redelivered")
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")+` WHERE message_id = 'e-good'`))
	require.Equal(t, len(refused), pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+
		` WHERE payload->>'destination_topic' = $1`, poisonTopic))

	// The relay forwards the parked copies to Kafka, whose marshaler takes every one of them.
	cfg := brokertest.Config(t, broker.Kafka, e.schema)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, err := broker.New(ctx, nil, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.DeleteKafkaTopics(poisonTopic); _ = b.Close() })
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	relay, err := outbox.NewRelay(e.db, pub, outbox.RelayConfig{Schema: e.schema}, nil)
	require.NoError(t, err)
	go func() { _ = relay.Run(ctx) }()
	defer relay.Close()
	ops, err := b.NewSubscriber("ops")
	require.NoError(t, err)
	defer ops.Close()
	parked, err := ops.Subscribe(ctx, poisonTopic)
	require.NoError(t, err)

	for range refused {
		m := testwait.Receive(t, parked, "a parked copy from the poison topic on Kafka")
		m.Ack()
		back, err := outbox.RecoverParked(m)
		require.NoError(t, err)
		var want *kgo.Record
		for _, r := range refused {
			if string(r.Value) == string(back.Payload) {
				want = r
			}
		}
		require.NotNil(t, want, "parked payload %q is one of the refused records'", back.Payload)
		require.Empty(t, back.UUID, "the records carried no Watermill UUID")
		for _, h := range want.Headers {
			require.Equal(t, string(h.Value), back.Metadata.Get(h.Key), "header %q byte for byte", h.Key)
		}
		require.Equal(t, "ledger-inbox", back.Metadata.Get(wmiddleware.PoisonedHandlerKey))
		require.NotEmpty(t, back.Metadata.Get(wmiddleware.ReasonForPoisonedKey))
	}
}

// The same Receiver behind a poison queue built as the docs once said, publishing through
// outbox.Writer.DBPublisher: no constructor of ours sees that queue, so it cannot be refused at
// construction (once.Stack refuses it). DBPublisher refuses the record without a UUID the
// Receiver refused, and says which publisher parks it (outbox.ErrNotParking, naming
// ParkingPublisher) in the error the router logs for each nack; the Receiver, seeing the refused
// record come back, warns once that nothing parks it. Before, the acceptance run saw 780
// refusals, 0 parked, and no word of why.
func TestReceiverBehindADBPublisherPoisonQueueSaysSo(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	writer, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	logs := watermill.NewCaptureLogger()
	receiver, err := inbox.NewReceiver(e.db, inbox.ReceiverConfig{Schema: e.schema, Consumer: "ledger", Key: wmonce.KeyFromMetadata("event_id")}, logs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = receiver.Close() })
	topic, sub := brokertest.OnePartitionKafka(t, "inbox_dbpub", "ledger")

	poison, err := wmiddleware.PoisonQueueWithFilter(writer.DBPublisher(e.db), "inbox.parked", wmonce.IsPermanent)
	require.NoError(t, err)
	// What the router sees of each delivery (it logs the error and nacks).
	answers := make(chan error, 100)
	seen := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			select {
			case answers <- err:
			default:
			}
			return out, err
		}
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, logger())
	require.NoError(t, err)
	router.AddConsumerHandler("ledger-inbox", topic, sub, receiver.Handle).AddMiddleware(seen, poison)
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	t.Cleanup(func() { _ = router.Close() })

	brokertest.ProduceForeign(t, topic, &kgo.Record{Value: []byte("\xff\x00 no key"), Headers: []kgo.RecordHeader{{Key: "source", Value: []byte("legacy")}}})
	for i := range 3 {
		err := testwait.Receive(t, answers, "a delivery of the refused record")
		require.ErrorIs(t, err, outbox.ErrNotParking, "delivery %d", i+1)
		require.ErrorContains(t, err, "ParkingPublisher")
	}
	var warnings int
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		if strings.HasPrefix(m.Msg, "WARNING: a message the receiver refused was delivered again") {
			warnings++
			require.Contains(t, m.Msg, "ParkingPublisher")
		}
	}
	require.Equal(t, 1, warnings, "warned once, at the first redelivery")
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")), "DBPublisher parked nothing")
}
