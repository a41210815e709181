package once_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// settledBy reports whether msg was acked or nacked already, without waiting.
func settledBy(msg *message.Message) string {
	select {
	case <-msg.Acked():
		return "acked"
	case <-msg.Nacked():
		return "nacked"
	default:
		return ""
	}
}

// handlerAcksContract: a handler that acks (or nacks) the message it gets (or the consumed message
// its context carries) settles nothing of the
// delivery: while it runs the delivery is untouched, its effect is applied exactly once (also
// when that attempt then fails and the message is redelivered), and each call is counted.
func handlerAcksContract(t *testing.T, p txPath) {
	for _, call := range []string{"Ack", "Nack"} {
		for _, failsFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, fails first: %v", call, failsFirst), func(t *testing.T) {
				t.Parallel()
				e := newPathEnv(t, p, once.Config{Consumer: "c"})
				var mu sync.Mutex
				var delivered *message.Message // the delivery the router answers for
				var settledEarly []string
				attempts := 0
				h := e.mw.Middleware(p.handler(func(msg *message.Message) ([]*message.Message, error) {
					// The message it was given, and the consumed message its context carries (the
					// outbox's causation source): neither may be the delivery.
					consumed, ok := outbox.ConsumedFromContext(msg.Context())
					if !ok {
						return nil, errors.New("no consumed message in the context")
					}
					for _, m := range []*message.Message{msg, consumed} {
						if call == "Ack" {
							m.Ack()
						} else {
							m.Nack()
						}
					}
					mu.Lock()
					if s := settledBy(delivered); s != "" {
						settledEarly = append(settledEarly, s)
					}
					attempts++
					fail := failsFirst && attempts == 1
					mu.Unlock()
					if _, err := e.effect(msg); err != nil {
						return nil, err
					}
					if fail {
						return nil, errors.New("fails after its write")
					}
					return nil, nil
				}))
				send := func() error {
					mu.Lock()
					delivered = message.NewMessage("e-1", []byte(`{}`))
					msg := delivered
					mu.Unlock()
					return e.send(h, msg)
				}
				if failsFirst {
					require.Error(t, send())
					require.Zero(t, e.effects(t), "the failed attempt applied nothing")
				}
				require.NoError(t, send())
				require.NoError(t, send(), "a further copy is a duplicate")
				require.Empty(t, settledEarly, "the handler's call reached the delivery before the library answered it")
				require.Equal(t, 1, e.effects(t))
				require.Equal(t, 1, e.claims(t))
				c := e.mw.Counters().Consumer("c")
				want := once.Counters{Fresh: 1, Duplicates: 1, HandlerAcked: 1}
				if failsFirst {
					want.Failed, want.HandlerAcked = 1, 2
				}
				require.Equal(t, want, c)
			})
		}
	}
}

// TestHandlerAckingItsMessageThroughRouter: a router consumes watermill-sql's subscriber (v3 and
// v4) with the middleware on each transaction path: its own transaction and group commit (the
// subscriber's transaction not reused: the user's own subscriber, as with Kafka or RabbitMQ),
// and the subscriber's transaction itself. The handler acks the message it is given, then writes
// its effect; one handler then fails its first attempt. Before the handler got a message of its
// own, its ack reached the subscriber: the offset was committed before the effect (1 ack,
// 0 effects for the failing handler; inside the subscriber's transaction the ack committed that
// transaction under the handler, 3 of 3 offsets with no effect). Now every message is applied
// exactly once and its offset committed with or after it.
func TestHandlerAckingItsMessageThroughRouter(t *testing.T) {
	t.Parallel()
	paths := []struct {
		name string
		sql  int
		cfg  once.Config
	}{
		{"own-tx", 3, once.Config{DisableSubscriberTxReuse: true, GroupCommit: once.GroupCommitConfig{Disabled: true}}},
		{"group-commit", 3, once.Config{DisableSubscriberTxReuse: true, GroupCommit: once.GroupCommitConfig{Workers: 1, Linger: 2 * time.Millisecond}}},
		{"subscriber-tx", 3, once.Config{}},
		{"subscriber-tx-v4", 4, once.Config{}},
	}
	for _, p := range paths {
		for _, failsFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, fails first: %v", p.name, failsFirst), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, p.cfg)
				pub, err := newSQLPublisher(p.sql, e.db, e.schema)
				require.NoError(t, err)
				sub, err := newSQLSubscriber(p.sql, e.db, e.schema, "rewards") // closed by the router
				require.NoError(t, err)

				var mu sync.Mutex
				attempts := map[string]int{}
				handler := func(msg *message.Message) ([]*message.Message, error) {
					msg.Ack()
					mu.Lock()
					attempts[msg.UUID]++
					fail := failsFirst && attempts[msg.UUID] == 1
					mu.Unlock()
					tx, ok := pgtx.TxFromContext(msg.Context())
					if !ok {
						return nil, errors.New("no transaction in the context")
					}
					if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+e.table("effects")+` (key, amount) VALUES ($1, 1)`, msg.UUID); err != nil {
						return nil, err
					}
					if fail {
						return nil, errors.New("fails after its write")
					}
					return nil, nil
				}
				runRouter(t, "rewards", "payments", sub, handler, e.mw.Middleware)
				acked := watchOffsets(t, e.db, e.schema).ackedOffsets(t, "payments", "rewards")
				for i := 1; i <= 3; i++ {
					require.NoError(t, pub.Publish("payments", message.NewMessage(fmt.Sprintf("e-%d", i), []byte(`{}`))))
				}
				waitAcked(t, acked, 3)
				require.Equal(t, 3, e.effects(t), "each message's effect committed by the time its offset was")
				require.Equal(t, 3, pgtest.Count(t, e.db, `SELECT count(DISTINCT key) FROM `+e.table("effects")))
				require.Equal(t, 3, e.claims(t))
				c := e.mw.Counters().Consumer("rewards")
				require.Equal(t, uint64(3), c.Fresh)
				if failsFirst {
					require.Equal(t, uint64(3), c.Failed)
					require.Equal(t, uint64(6), c.HandlerAcked)
				} else {
					require.Equal(t, uint64(3), c.HandlerAcked)
				}
			})
		}
	}
}

// The hooks the middleware calls before the handler (Config.Key, Config.OccurredAt) get a view
// of the delivery whose Ack and Nack reach nobody either: a key function that acked would have
// let the broker forget a message whose handler then failed.
func TestKeyFunctionsCannotSettleTheDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{
		Consumer: "c", GroupCommit: once.GroupCommitConfig{Disabled: true}, MaxMessageAge: time.Hour,
		Key: func(msg *message.Message) (string, error) {
			msg.Ack()
			return msg.UUID, nil
		},
		OccurredAt: func(msg *message.Message) (time.Time, bool, error) {
			msg.Nack()
			return time.Time{}, false, nil
		},
	})
	fail := true
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if _, err := e.effect(msg); err != nil {
			return nil, err
		}
		if fail {
			fail = false
			return nil, errors.New("fails after its write")
		}
		return nil, nil
	})
	delivered := message.NewMessage("e-1", []byte(`{}`))
	_, err := h(delivered)
	require.Error(t, err)
	require.Empty(t, settledBy(delivered), "left for the router to nack")
	delivered = message.NewMessage("e-1", []byte(`{}`))
	_, err = h(delivered)
	require.NoError(t, err)
	require.Empty(t, settledBy(delivered), "left for the router to ack")
	require.Equal(t, 1, e.effects(t))
}
