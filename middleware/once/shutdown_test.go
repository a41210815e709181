package once_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
)

// Pins the documented limit of ShutdownGrace: inside watermill-sql's subscriber transaction it
// cannot help, because the subscriber begins that transaction with the subscription context,
// which Router.Close cancels, and database/sql rolls it back at once. Nothing of the running
// attempt commits, and the message is applied once when the consumer runs again.
func TestShutdownGraceDoesNotReachTheSubscriberTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{ShutdownGrace: 5 * time.Second})
	topic := "payments"
	started := make(chan struct{})
	var runs atomic.Int32
	handler := func(msg *message.Message) ([]*message.Message, error) {
		if _, err := e.effect(msg); err != nil {
			return nil, err
		}
		if runs.Add(1) == 1 {
			close(started)
			<-msg.Context().Done() // still running when Router.Close cancels the message
		}
		return nil, nil
	}
	pub, sub := sqlPubSub(t, e.db, e.schema, "rewards")
	r := runRouter(t, "rewards", topic, sub, handler, e.mw.Middleware)
	acked := watchOffsets(t, e.db, e.schema).ackedOffsets(t, topic, "rewards")
	require.NoError(t, pub.Publish(topic, message.NewMessage("e-1", []byte(`{}`))))
	<-started
	require.NoError(t, r.Close())
	require.Zero(t, e.effects(t), "the subscriber's transaction was rolled back despite the grace")
	require.Zero(t, e.claims(t))
	require.Zero(t, pgtest.Count(t, e.db, `SELECT coalesce(max(offset_acked), 0) FROM `+e.table("watermill_offsets_"+topic)), "the message was not acked")
	require.Empty(t, acked, "no offset was committed")

	_, sub2 := sqlPubSub(t, e.db, e.schema, "rewards")
	runRouter(t, "rewards", topic, sub2, handler, e.mw.Middleware)
	waitAcked(t, acked, 1) // the redelivery
	require.Equal(t, 1, e.effects(t), "applied once, on redelivery")
	require.Equal(t, 1, e.claims(t))
}
