package once_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
)

func compose(stack []message.HandlerMiddleware, h message.HandlerFunc) message.HandlerFunc {
	for i := len(stack) - 1; i >= 0; i-- {
		h = stack[i](h)
	}
	return h
}

func TestStackConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := once.Stack(once.StackConfig{})
	require.ErrorContains(t, err, "Middleware is required")
	e := newEnv(t, once.Config{})
	for name, cfg := range map[string]once.StackConfig{
		"DisableParking with PoisonTopic":     {DisableParking: true, PoisonTopic: "p"},
		"DisableParking with PoisonPublisher": {DisableParking: true, PoisonPublisher: newCapture()},
		"DisableParking with ShouldPark":      {DisableParking: true, ShouldPark: wmonce.IsPermanent},
		"PoisonTopic the outbox refuses":      {PoisonTopic: "has space"},
		"PoisonTopic of a publisher refused":  {PoisonTopic: "has space", PoisonPublisher: newCapture()},
		"negative Timeout":                    {Timeout: -time.Second},
	} {
		cfg.Middleware = e.mw
		_, err := once.Stack(cfg)
		require.Error(t, err, name)
	}
	for name, cfg := range map[string]once.StackConfig{
		"defaults":                 {},
		"PoisonTopic alone":        {PoisonTopic: "parked"},
		"PoisonPublisher alone":    {PoisonPublisher: newCapture()},
		"DisableParking, no queue": {DisableParking: true},
	} {
		cfg.Middleware = e.mw
		_, err := once.Stack(cfg)
		require.NoError(t, err, name)
	}
}

// A poison publisher that cannot park every message is refused at construction, with the one
// to use instead: the Writer's Publisher (it needs the handler's transaction, which a parked
// message no longer has: nothing would be parked) and DBPublisher (the earlier docs' way).
func TestStackRefusesAPoisonPublisherThatCannotPark(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{})
	w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	for name, pub := range map[string]message.Publisher{
		"Writer.Publisher":   w.Publisher(),
		"Writer.DBPublisher": w.DBPublisher(e.db),
	} {
		_, err := once.Stack(once.StackConfig{Middleware: e.mw, PoisonPublisher: pub})
		require.ErrorIs(t, err, outbox.ErrNotParking, name)
		require.ErrorContains(t, err, "PoisonPublisher", name)
		require.ErrorContains(t, err, "ParkingPublisher", name)
	}
	_, err = once.Stack(once.StackConfig{Middleware: e.mw, PoisonPublisher: w.ParkingPublisher(e.db)})
	require.NoError(t, err)
}

// With nothing but the Middleware, the Stack parks: a message without a UUID and a handler's
// permanent failure are stored in the middleware's own outbox under DefaultPoisonTopic and
// acked, and the original comes back from the parked copy. It used to park nothing without a
// PoisonPublisher: both were nacked, redelivered forever, and blocked their partition.
func TestStackParksByDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	stack, err := once.Stack(once.StackConfig{Middleware: e.mw, Retry: wmiddleware.Retry{InitialInterval: time.Millisecond}})
	require.NoError(t, err)
	h := compose(stack, func(msg *message.Message) ([]*message.Message, error) {
		if string(msg.Payload) == "poison" {
			return nil, wmonce.Permanent(errors.New("cannot decode"))
		}
		return e.effect(msg)
	})
	anonymous := message.NewMessage("", []byte("no id"))
	anonymous.Metadata.Set("trace", "\xff")
	_, err = h(anonymous)
	require.NoError(t, err, "parked and acked")
	require.NoError(t, deliver(h, "e-1", "poison"), "parked and acked")
	require.NoError(t, deliver(h, "e-2", "fine"))
	require.Equal(t, 1, e.effects(t))

	parked := parkedCopies(t, e, once.DefaultPoisonTopic)
	require.Len(t, parked, 2)
	for _, p := range parked {
		back, err := outbox.RecoverParked(p)
		require.NoError(t, err)
		switch string(back.Payload) {
		case "no id":
			require.Empty(t, back.UUID)
			require.Equal(t, "\xff", back.Metadata.Get("trace"))
			require.Contains(t, back.Metadata.Get(wmiddleware.ReasonForPoisonedKey), "key")
		case "poison":
			require.Equal(t, "e-1", back.UUID)
			require.Contains(t, back.Metadata.Get(wmiddleware.ReasonForPoisonedKey), "cannot decode")
		default:
			t.Fatalf("unexpected parked message %q", back.Payload)
		}
	}
}

// DisableParking is the explicit way back to nack-forever.
func TestStackDisableParkingNacks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	stack, err := once.Stack(once.StackConfig{Middleware: e.mw, DisableParking: true})
	require.NoError(t, err)
	h := compose(stack, e.effect)
	require.ErrorIs(t, deliver(h, "", "no id"), wmonce.ErrInvalidKey)
	require.Empty(t, parkedCopies(t, e, once.DefaultPoisonTopic))
}

// The case on a real Kafka broker: a record from a producer that is not Watermill has
// no _watermill_message_uuid header, so its UUID is empty. With the Stack's defaults it is
// parked and acked, and the partition behind it keeps flowing. Before, the Stack parked nothing
// without a PoisonPublisher: the record was nacked and redelivered forever and the next record
// of its partition was never applied.
func TestStackParksByDefaultOnKafka(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "ledger"})
	topic, sub := brokertest.OnePartitionKafka(t, "stack_default", "ledger")
	stack, err := once.Stack(once.StackConfig{Middleware: e.mw})
	require.NoError(t, err)
	// Outermost, it sees what the router sees: nil (ack) comes after the commit or the parking.
	acked := make(chan string, 10)
	observe := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				acked <- msg.UUID
			}
			return out, err
		}
	}
	runRouter(t, "ledger", topic, sub, e.effect, append([]message.HandlerMiddleware{observe}, stack...)...)

	brokertest.ProduceForeign(t, topic,
		&kgo.Record{Value: []byte(`{"amount":1}`), Headers: []kgo.RecordHeader{{Key: "source", Value: []byte("legacy")}}},
		&kgo.Record{Value: []byte(`{"amount":2}`), Headers: []kgo.RecordHeader{{Key: "_watermill_message_uuid", Value: []byte("good-1")}}},
	)
	require.Empty(t, testwait.Receive(t, acked, "the record without a UUID to be parked and acked"))
	require.Equal(t, "good-1", testwait.Receive(t, acked, "the record behind it to be applied and acked"))
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE key = 'good-1'`))

	parked := parkedCopies(t, e, once.DefaultPoisonTopic)
	require.Len(t, parked, 1)
	back, err := outbox.RecoverParked(parked[0])
	require.NoError(t, err)
	require.Empty(t, back.UUID)
	require.Equal(t, `{"amount":1}`, string(back.Payload))
	require.Equal(t, "legacy", back.Metadata.Get("source"))
	require.Equal(t, "ledger", back.Metadata.Get(wmiddleware.PoisonedHandlerKey))
}

// parkedCopies reads the messages stored in e's outbox for topic, as the relay would forward them.
func parkedCopies(t *testing.T, e *env, topic string) []*message.Message {
	t.Helper()
	rows, err := e.db.Query(`SELECT payload->>'uuid', decode(payload->>'payload', 'base64'), metadata::text FROM `+e.table("outbox")+
		` WHERE payload->>'destination_topic' = $1 ORDER BY "offset"`, topic)
	require.NoError(t, err)
	defer rows.Close()
	var out []*message.Message
	for rows.Next() {
		var uuid, md string
		var payload []byte
		require.NoError(t, rows.Scan(&uuid, &payload, &md))
		m := message.NewMessage(uuid, payload)
		require.NoError(t, json.Unmarshal([]byte(md), &m.Metadata))
		out = append(out, m)
	}
	require.NoError(t, rows.Err())
	return out
}
