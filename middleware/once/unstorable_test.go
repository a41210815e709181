package once_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
)

// A handler output the outbox can never store fails every retry the same way: it must be a
// permanent error (parked by the Stack), as an output without a topic is, not a transient one
// retried and nacked forever while it blocks its partition.
func TestUnstorableOutputsArePermanentErrors(t *testing.T) {
	t.Parallel()
	out := func(uuid string, md ...string) *message.Message {
		m := message.NewMessage(uuid, []byte("p"))
		for i := 0; i < len(md); i += 2 {
			m.Metadata.Set(md[i], md[i+1])
		}
		return m
	}
	cases := map[string]struct {
		topic string
		out   *message.Message
	}{
		"empty UUID":                     {"cashback", out("")},
		"UUID longer than MaxUUIDLength": {"cashback", out(strings.Repeat("u", outbox.MaxUUIDLength+1))},
		"UUID not UTF-8":                 {"cashback", out("abc\xff")},
		"metadata value not UTF-8":       {"cashback", out("o", "note", "abc\xff")},
		"metadata key not UTF-8":         {"cashback", out("o", "k\xff", "v")},
		"metadata value with NUL":        {"cashback", out("o", "note", "a\x00b")},
		"topic refused by ValidateTopic": {"refused", out("o")},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, once.Config{Consumer: "c"})
			w, err := outbox.NewWriter(outbox.Config{Schema: e.schema, ValidateTopic: func(topic string) error {
				if topic == "refused" {
					return errors.New("topic refused by the broker's rules")
				}
				return nil
			}})
			require.NoError(t, err)
			mw, err := once.New(e.db, once.Config{Schema: e.schema, Consumer: "c", Outbox: w, OutputTopic: c.topic}, nil)
			require.NoError(t, err)
			h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				if _, err := e.effect(msg); err != nil {
					return nil, err
				}
				return []*message.Message{c.out}, nil
			})
			err = deliver(h, "e-1", "p")
			require.True(t, wmonce.IsPermanent(err), "permanent: %v", err)
			require.ErrorIs(t, err, once.ErrUnstorableOutput)
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			require.Zero(t, e.effects(t), "rolled back")
			require.Zero(t, e.claims(t))
			require.Equal(t, once.Counters{Failed: 1}, mw.Counters().Consumer("c"))
		})
	}
}

// The same through outbox.Writer.Publisher inside the handler: the handler returns the
// publisher's error, which is permanent too.
func TestUnstorablePublishedMessageIsPermanent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		o := message.NewMessage("o", nil)
		o.Metadata.Set("note", "abc\xff")
		o.SetContext(msg.Context())
		return nil, w.Publisher().Publish("cashback", o)
	})
	err = deliver(h, "e-1", "p")
	require.True(t, wmonce.IsPermanent(err), "permanent: %v", err)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
}

// With the Stack, an unstorable output is parked at once instead of retried. And a message
// the outbox cannot store as it is (binary metadata, here) can still be parked: it is made
// storable and marked, never altered silently nor nacked forever.
func TestStackParksUnstorableOutputsAndBinaryMetadata(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c", OutputTopic: "cashback"})
	w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	stack, err := once.Stack(once.StackConfig{
		Middleware:      e.mw,
		Retry:           wmiddleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond},
		PoisonPublisher: w.ParkingPublisher(e.db),
		PoisonTopic:     "poison",
	})
	require.NoError(t, err)
	var calls atomic.Int32
	h := compose(stack, func(msg *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		return []*message.Message{message.NewMessage("", []byte("no id"))}, nil
	})
	in := message.NewMessage("e-1", []byte("p"))
	in.Metadata.Set("trace", "abc\xff")
	_, err = h(in)
	require.NoError(t, err, "parked and acked")
	require.Equal(t, int32(1), calls.Load(), "not retried")

	var trace, keys string
	require.NoError(t, e.db.QueryRow(`SELECT metadata->>'trace', metadata->>$1 FROM `+e.table("outbox")+
		` WHERE uuid = 'e-1' AND payload->>'destination_topic' = 'poison'`, "metadata_base64_keys").Scan(&trace, &keys))
	require.Equal(t, base64.StdEncoding.EncodeToString([]byte("abc\xff")), trace)
	require.JSONEq(t, `["trace"]`, keys)
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")), "only the parked copy")
}
