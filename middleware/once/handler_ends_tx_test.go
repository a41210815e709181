package once_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// handlerEndsTxContract: a handler that writes, ends the transaction it was given and returns
// an output leaves nothing applied (no effect, claim or output) and is parked by the Stack with
// a reason that says so; the same message redelivered is parked again, never applied, and
// every other message goes on as usual.
func handlerEndsTxContract(t *testing.T, p txPath) {
	for _, ending := range pgtest.TxEndings {
		t.Run(ending.Name, func(t *testing.T) {
			t.Parallel()
			e := newPathEnv(t, p, once.Config{Consumer: "c", OutputTopic: "out"})
			w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
			require.NoError(t, err)
			stack, err := once.Stack(once.StackConfig{
				Middleware:      e.mw,
				Retry:           wmiddleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond},
				PoisonPublisher: w.ParkingPublisher(e.db),
				PoisonTopic:     "poison",
			})
			require.NoError(t, err)
			handler := func(msg *message.Message) ([]*message.Message, error) {
				if _, err := e.effect(msg); err != nil {
					return nil, err
				}
				if msg.UUID == "ends-tx" {
					tx, _ := pgtx.TxFromContext(msg.Context())
					ending.End(tx)
					// Writes after the ending, errors ignored: none may apply.
					_, _ = tx.ExecContext(msg.Context(), `INSERT INTO `+e.table("effects")+` (key, amount) VALUES ('ends-tx/after', 1)`)
				}
				return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte(`{}`))}, nil
			}

			// Without the Stack the error is permanent and says what happened.
			err = e.deliver(e.mw.Middleware(p.handler(handler)), "ends-tx", "p")
			require.ErrorIs(t, err, wmonce.ErrHandlerEndedTx)
			require.True(t, wmonce.IsPermanent(err))
			require.Contains(t, err.Error(), "the handler ended the transaction")

			h := compose(stack, p.handler(handler))
			require.NoError(t, e.deliver(h, "ends-tx", "p"), "parked and acked")
			require.NoError(t, e.deliver(h, "ends-tx", "p"), "a redelivery is parked again, never applied")
			require.NoError(t, e.deliver(h, "fine", "p"))

			require.Equal(t, 1, e.effects(t), "only the message that left its transaction alone applied")
			require.Equal(t, 1, e.claims(t))
			require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE payload->>'destination_topic' = 'out'`))
			require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE key LIKE 'ends-tx%'`))
			parked := pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+
				` WHERE payload->>'destination_topic' = 'poison' AND uuid = 'ends-tx' AND metadata->>'reason_poisoned' LIKE '%the handler ended the transaction%'`)
			require.Equal(t, 2, parked, "parked once per delivery, with the reason")
			c := e.mw.Counters().Consumer("c")
			require.Equal(t, uint64(3), c.HandlerEndedTx)
			require.Equal(t, uint64(1), c.Fresh)
		})
	}
}

// TestGroupCommitHandlerEndingTheTxTouchesNoNeighbour: with one lane busy, five messages wait
// and run as one group; the third handler commits the group's transaction. The attempt guard
// refuses that COMMIT, so nothing of the group is in; the third is answered with the permanent
// error alone, and the other four run again and are applied once each, with their outputs.
func TestGroupCommitHandlerEndingTheTxTouchesNoNeighbour(t *testing.T) {
	t.Parallel()
	for _, ending := range pgtest.TxEndings {
		t.Run(ending.Name, func(t *testing.T) {
			t.Parallel()
			cfg := once.Config{Consumer: "c", OutputTopic: "out"}
			cfg.GroupCommit = once.GroupCommitConfig{Workers: 1, TxBatchSize: 50}
			e := newEnv(t, cfg)
			t.Cleanup(func() { _ = e.mw.Close() })
			signals := once.GroupCommitTestSignals(e.mw)

			release := make(chan struct{})
			h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				if msg.UUID == "busy" {
					<-release // holds the only lane while the group forms
				}
				if _, err := e.effect(msg); err != nil {
					return nil, err
				}
				if msg.UUID == "m-3" {
					tx, _ := pgtx.TxFromContext(msg.Context())
					ending.End(tx)
				}
				return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte(`{}`))}, nil
			})

			var wg sync.WaitGroup
			errs := map[string]error{}
			var mu sync.Mutex
			run := func(uuid string) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := deliver(h, uuid, "p")
					mu.Lock()
					errs[uuid] = err
					mu.Unlock()
				}()
			}
			run("busy")
			for i := 1; i <= 5; i++ {
				run(fmt.Sprintf("m-%d", i))
				require.Equal(t, i, signals.Queued.WaitOrTimeout(), "m-%d waits in order", i) // the group's order is m-1..m-5
			}
			close(release)
			wg.Wait()
			require.Equal(t, "m-3", signals.Isolated.WaitOrTimeout(), "m-3 alone was answered with its failure")
			require.Equal(t, 4, signals.Committed.WaitOrTimeout(), "the other four committed as one group")

			for uuid, err := range errs {
				if uuid == "m-3" {
					require.ErrorIs(t, err, wmonce.ErrHandlerEndedTx)
					require.True(t, wmonce.IsPermanent(err))
					continue
				}
				require.NoError(t, err, uuid)
			}
			require.Equal(t, 5, e.effects(t), "busy and m-1, m-2, m-4, m-5, once each")
			require.Equal(t, 5, pgtest.Count(t, e.db, `SELECT count(DISTINCT key) FROM `+e.table("effects")))
			require.Equal(t, 5, e.claims(t))
			require.Equal(t, 5, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")))
			require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE uuid = 'out-m-3'`))

			// Redeliveries: the four are duplicates, m-3 fails the same way again.
			for i := 1; i <= 5; i++ {
				err := deliver(h, fmt.Sprintf("m-%d", i), "p")
				if i == 3 {
					require.True(t, errors.Is(err, wmonce.ErrHandlerEndedTx))
				} else {
					require.NoError(t, err)
				}
			}
			require.Equal(t, 5, e.effects(t))
			c := e.mw.Counters().Consumer("c")
			require.Equal(t, uint64(2), c.HandlerEndedTx)
			require.Equal(t, uint64(4), c.Duplicates)
		})
	}
}
