package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/pgtx"
)

// storeRows stores n rows e-0 .. e-(n-1) in one transaction, before any processor runs, so
// that claims and TxBatchSize batches form as configured.
func storeRows(t *testing.T, e *env, r *inbox.Receiver, n int) {
	t.Helper()
	var msgs []*message.Message
	for i := range n {
		msgs = append(msgs, msg(fmt.Sprintf("e-%d", i), "x"))
	}
	storeAll(t, e, r, msgs)
}

// A handler that writes, ends the transaction it was lent (Commit, Rollback, or both) and
// returns an output as if all went well applies nothing: no effect and no output of it commit,
// and its row is parked as FAILED at its first attempt with a reason that says the handler ended
// the transaction. Every other row, in its TxBatchSize batch or not, is applied exactly once
// with its output. Before the attempt guard a Commit there applied the row's effects without
// its output, and in a batch the rows before it were applied twice (once by the handler's
// COMMIT, once more by the fallback to one row per transaction).
//
// One worker, so that the batches form as configured (the third row, e-2, in the first batch)
// and the counts are exact.
//
// On a pool not from pgtx.Open (plain: the server's guard, migrations 010, 011 and 017) the same
// holds, except what README's "Where it stops" says: a write the handler sends after a COMMIT
// or ROLLBACK sent as SQL text runs in autocommit (the row e-2/after below), and so does, with
// a batch handler, the write of the next message in its batch (e-3).
func testHandlerEndingItsTransaction(t *testing.T, batch bool) {
	t.Parallel()
	plainDB, err := sql.Open("pgx", pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = plainDB.Close() })
	for _, plain := range []bool{false, true} {
		for _, txBatch := range []int{1, 4} {
			for _, ending := range pgtest.TxEndings {
				name := fmt.Sprintf("TxBatchSize %d, %s", txBatch, ending.Name)
				if plain {
					name = "plain pool, " + name
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					e := newEnv(t).handlers(batch)
					if plain {
						e = newEnvOn(t, plainDB).handlers(batch)
					}
					r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
					storeRows(t, e, r, 6)
					cfg := fast("c")
					cfg.Workers, cfg.TxBatchSize, cfg.OutputTopic = 1, txBatch, "out"
					p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
						if err := e.effect(m, "w"); err != nil {
							return nil, err
						}
						if m.UUID == "e-2" {
							tx, _ := pgtx.TxFromContext(m.Context())
							ending.End(tx)
							// A write after the ending, its error ignored: it must not apply either.
							_, _ = tx.ExecContext(m.Context(), `INSERT INTO `+e.table("effects")+` (message_id) VALUES ('e-2/after')`)
						}
						return []*message.Message{message.NewMessage("out-"+m.UUID, []byte(`{}`))}, nil
					}, cfg)
					p.until(t, "five rows done and one parked", func(n tally) bool { return n.Done == 5 && n.Parked == 1 })

					after, twice := 0, 0
					if plain && strings.Contains(ending.Name, "as text") {
						after = 1 // uncovered on a plain pool: see above
						if batch && txBatch > 1 {
							// The batch function is the handler that goes on after the ending: the
							// write of e-3, its next message, runs in autocommit too, and e-3 is
							// applied again when the batch falls back to one row per transaction,
							// where e-2, run again alone, sends its own write once more.
							twice, after = 1, 2
						}
					}
					require.Equal(t, 5+twice, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE message_id NOT LIKE 'e-2%'`), "every row but e-2 applied")
					require.Equal(t, 5, pgtest.Count(t, e.db, `SELECT count(DISTINCT message_id) FROM `+e.table("effects")+` WHERE message_id NOT LIKE 'e-2%'`), "once each")
					require.Equal(t, twice, pgtest.Count(t, e.db, `SELECT count(*) - 1 FROM `+e.table("effects")+` WHERE message_id = 'e-3'`))
					require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE message_id = 'e-2'`))
					require.Equal(t, after, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE message_id = 'e-2/after'`))
					require.Equal(t, 5, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE payload->>'destination_topic' = 'out'`))
					require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")+` WHERE uuid = 'out-e-2'`))
					require.Equal(t, 5, e.status(t, "c", inbox.StatusDone))

					row, err := e.ops.InspectMessage(context.Background(), "c", "e-2")
					require.NoError(t, err)
					require.Equal(t, inbox.StatusFailed, row.Status)
					require.Equal(t, 1, row.Attempts, "parked at once, not retried")
					require.Contains(t, row.LastError, "the handler ended the transaction")
					require.Contains(t, row.LastError, "nothing of it was applied")

					c := p.Counters()
					require.Equal(t, uint64(1), c.HandlerEndedTx)
					require.Equal(t, uint64(1), c.Failed)
				})
			}
		}
	}
}

// A handler that outlives HandlerTimeout and then returns as if all went well finds its
// transaction rolled back by database/sql, not by itself: the attempt is a timeout, retried (in
// a batch: the batch runs again one row per transaction, as after any failure), and never
// parked as a handler that ended its transaction.
func testHandlerPastTimeoutIsNotTakenForEndingItsTransaction(t *testing.T, batch bool) {
	t.Parallel()
	for _, txBatch := range []int{1, 3} {
		t.Run(fmt.Sprintf("TxBatchSize %d", txBatch), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t).handlers(batch)
			r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
			storeRows(t, e, r, 3)
			cfg := fast("c")
			cfg.Workers, cfg.TxBatchSize, cfg.HandlerTimeout = 1, txBatch, 200*time.Millisecond
			var stalled atomic.Bool
			p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
				if err := e.effect(m, "w"); err != nil {
					return nil, err
				}
				if m.UUID == "e-1" && stalled.CompareAndSwap(false, true) {
					<-m.Context().Done() // HandlerTimeout: database/sql rolls the transaction back
				}
				return nil, nil
			}, cfg)
			p.until(t, "every row done", func(n tally) bool { return n.Done == 3 })
			require.Equal(t, 3, e.effects(t))
			require.Zero(t, p.Counters().HandlerEndedTx)
			require.Zero(t, p.Counters().Parked)
			row, err := e.ops.InspectMessage(context.Background(), "c", "e-1")
			require.NoError(t, err)
			require.Equal(t, inbox.StatusDone, row.Status)
			if txBatch == 1 {
				require.Contains(t, row.LastError, "HandlerTimeout", "a failed attempt of its own")
			}
		})
	}
}

// With four workers a handler that commits the transaction it was lent applies nothing either,
// and its row ends parked: its claim outlives the ended transaction, so no other worker runs it
// meanwhile.
func TestHandlerEndingItsTransactionWithSeveralWorkersAppliesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	cfg := fast("c")
	cfg.Workers = 4
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if err := e.effect(m, "w"); err != nil {
			return nil, err
		}
		tx, _ := pgtx.TxFromContext(m.Context())
		return nil, tx.Commit()
	}, cfg)
	require.NoError(t, r.Handle(msg("e-1", "x")))
	p.until(t, "parking", func(n tally) bool { return n.Parked == 1 })
	require.Zero(t, e.effects(t))
	row, err := e.ops.InspectMessage(context.Background(), "c", "e-1")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusFailed, row.Status)
	require.Contains(t, row.LastError, "the handler ended the transaction")
	require.GreaterOrEqual(t, p.Counters().HandlerEndedTx, uint64(1))
}

// A Processor on a schema without the attempt guard (migration 011 not run) does not run its
// handler: every attempt would fail at the handler's first statement and park its row. Its
// workers wait as for a failing claim, counting an error, and process the rows once the
// migrations have run.
func TestProcessorWaitsForTheAttemptGuard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	mig, err := migrate.New(e.db, migrate.Config{Schema: e.schema}, nil)
	require.NoError(t, err)
	_, err = mig.Migrate(ctx, migrate.DirectionDown, &migrate.Opts{TargetVersion: 10})
	require.NoError(t, err)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	require.NoError(t, r.Handle(msg("e-1", "x")))
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "w") }, fast("c"))
	require.ErrorContains(t, p.sig.ClaimFailed.WaitOrTimeout(), "the attempt guard, migration 011", "the missing guard is reported")
	row, err := e.ops.InspectMessage(ctx, "c", "e-1")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusPending, row.Status)
	require.Zero(t, row.Attempts)

	_, err = mig.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
	p.until(t, "the row to be processed", func(n tally) bool { return n.Done == 1 })
	require.Equal(t, 1, e.effects(t))
}

// On a pool from pgtx.Open the processing transaction is guarded by its connection
// (txguard.For): the server's attempt guard is never opened, and a
// handler's COMMIT is refused all the same (the row is parked, nothing applied).
func TestProcessorGuardsOnTheWire(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	state := "wmonce.attempt_" + e.schema // as migration 010 reads it
	seen := make(chan string, 4)
	cfg := fast("c")
	p := e.start(t, func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgtx.TxFromContext(msg.Context())
		var s string
		if err := tx.QueryRowContext(msg.Context(), `SELECT coalesce(current_setting($1, true), '')`, state).Scan(&s); err != nil {
			return nil, err
		}
		seen <- s
		if err := e.effect(msg, "w"); err != nil {
			return nil, err
		}
		if msg.UUID == "commits" {
			return nil, tx.Commit()
		}
		return nil, nil
	}, cfg)
	require.NoError(t, r.Handle(msg("fine", "x")))
	p.until(t, "the first row", func(n tally) bool { return n.Done == 1 })
	require.Empty(t, <-seen, "the server's guard was not opened")
	require.NoError(t, r.Handle(msg("commits", "x")))
	p.until(t, "parking", func(n tally) bool { return n.Parked == 1 })
	require.Equal(t, 1, e.effects(t), "the handler's COMMIT was refused: nothing of it applied")
}
