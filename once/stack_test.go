package once_test

import (
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/once"
	"github.com/wmonce/watermill-once/oncetype"
	"github.com/wmonce/watermill-once/outbox"
)

func compose(stack []message.HandlerMiddleware, h message.HandlerFunc) message.HandlerFunc {
	for i := len(stack) - 1; i >= 0; i-- {
		h = stack[i](h)
	}
	return h
}

func TestStackRetriesTransientErrorsInFreshTransactions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	stack, err := once.Stack(once.StackConfig{
		Middleware: e.mw,
		Retry:      wmiddleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond},
	})
	require.NoError(t, err)
	var calls atomic.Int32
	h := compose(stack, func(msg *message.Message) ([]*message.Message, error) {
		if _, err := e.effect(msg); err != nil {
			return nil, err
		}
		if calls.Add(1) < 3 {
			return nil, errors.New("transient")
		}
		return nil, nil
	})
	require.NoError(t, deliver(h, "e-1", "p"))
	require.Equal(t, int32(3), calls.Load())
	require.Equal(t, 1, e.effects(t), "the two failed attempts were rolled back")
	require.Equal(t, 1, e.claims(t))
}

func TestStackParksPermanentFailuresWithoutRetrying(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	stack, err := once.Stack(once.StackConfig{
		Middleware:      e.mw,
		Retry:           wmiddleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond},
		PoisonPublisher: w.DBPublisher(e.db),
		PoisonTopic:     "poison",
	})
	require.NoError(t, err)
	var calls atomic.Int32
	h := compose(stack, func(msg *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		var v struct{ Amount int }
		if err := json.Unmarshal(msg.Payload, &v); err != nil {
			_, _ = e.effect(msg) // a write that must not survive
			return nil, oncetype.Permanent(err)
		}
		return e.effect(msg)
	})
	require.NoError(t, deliver(h, "bad", "not json"), "parked and acked: it no longer blocks the queue")
	require.Equal(t, int32(1), calls.Load(), "permanent errors are not retried")
	require.NoError(t, deliver(h, "good", `{"Amount":1}`))
	require.Equal(t, 1, e.effects(t), "only the good message applied")

	var reason string
	require.NoError(t, e.db.QueryRow(`SELECT metadata->>'reason_poisoned' FROM `+e.table("outbox")+` WHERE uuid = 'bad'`).Scan(&reason))
	require.Contains(t, reason, "permanent")
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE payload->>'destination_topic' = 'poison'`))

	// A message with an unusable key is parked the same way, never applied.
	require.NoError(t, deliver(h, "", `{"Amount":1}`))
	require.Equal(t, 2, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE payload->>'destination_topic' = 'poison'`))
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE metadata->>'uuid_missing' = 'true'`))
	require.Equal(t, 1, e.effects(t))
}

func TestStackConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := once.Stack(once.StackConfig{})
	require.ErrorContains(t, err, "Middleware is required")
	e := newEnv(t, once.Config{})
	_, err = once.Stack(once.StackConfig{Middleware: e.mw, PoisonTopic: "p"})
	require.ErrorContains(t, err, "PoisonPublisher")
}
