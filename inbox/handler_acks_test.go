package inbox_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// A handler that acks (or nacks) the message it is given, then writes its effect, and one that
// then fails its first attempt: the Processor gives each handler a message of its own (the
// Receiver acked the delivery when it stored the row), so the call changes nothing. Every row is
// applied exactly once, the failed attempt is retried (in a batch: its neighbours run again, one
// per transaction), and each call is counted in HandlerAcked.
func testHandlerAckingItsMessage(t *testing.T, batch bool) {
	t.Parallel()
	for _, call := range []string{"Ack", "Nack"} {
		for _, txBatch := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s, TxBatchSize %d", call, txBatch), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t).handlers(batch)
				r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
				storeRows(t, e, r, 3)
				cfg := fast("c")
				cfg.Workers, cfg.TxBatchSize = 1, txBatch
				var mu sync.Mutex
				attempts := map[string]int{}
				p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
					if call == "Ack" {
						m.Ack()
					} else {
						m.Nack()
					}
					mu.Lock()
					attempts[m.UUID]++
					fail := m.UUID == "e-1" && attempts[m.UUID] == 1
					mu.Unlock()
					if err := e.effect(m, "w"); err != nil {
						return nil, err
					}
					if fail {
						return nil, errors.New("fails after its write")
					}
					return nil, nil
				}, cfg)
				p.until(t, "three rows done", func(n tally) bool { return n.Done == 3 })

				require.Equal(t, 3, e.effects(t))
				require.Equal(t, 3, pgtest.Count(t, e.db, `SELECT count(DISTINCT message_id) FROM `+e.table("effects")), "once each")
				mu.Lock()
				calls := 0
				for _, n := range attempts {
					calls += n
				}
				mu.Unlock()
				c := p.Counters()
				require.Equal(t, uint64(calls), c.HandlerAcked, "every run's call counted, the failed one's too")
				if txBatch == 1 {
					require.Equal(t, 4, calls)
					require.Equal(t, uint64(1), c.Failed)
				}
			})
		}
	}
}

// The Receiver's hooks (Key, OrderingKey, OccurredAt) get a view of the delivery whose Ack and
// Nack reach nobody: a key function that acked would have let the broker forget a message
// before its row was stored (lost if the store then failed).
func TestReceiverHooksCannotSettleTheDelivery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{
		Consumer: "c", MaxMessageAge: time.Hour,
		Key: func(m *message.Message) (string, error) {
			m.Ack()
			return m.UUID, nil
		},
		OrderingKey: func(m *message.Message) (string, error) {
			m.Nack()
			return "k", nil
		},
		OccurredAt: func(m *message.Message) (time.Time, bool, error) {
			m.Ack()
			return time.Time{}, false, nil
		},
	})
	delivered := msg("e-1", "x")
	require.NoError(t, r.Handle(delivered))
	select {
	case <-delivered.Acked():
		t.Fatal("a hook acked the delivery")
	case <-delivered.Nacked():
		t.Fatal("a hook nacked the delivery")
	default: // left for the router to ack
	}
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")+` WHERE message_id = 'e-1'`))
}
