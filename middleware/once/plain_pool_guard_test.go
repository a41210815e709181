package once_test

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/pgwire"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// TestHandlerEndingTheTxOnAPlainPool: on a pool not from pgtx.Open the server's attempt guard
// (migrations 010, 011, 017) keeps the contract: a handler that ends its transaction, in any of
// the ways of pgtest.TxEndings and returns an output, applies nothing of the attempt (no claim,
// no effect written before the ending, no output), and the delivery fails with the permanent
// wmonce.ErrHandlerEndedTx, counted, in its own transaction and in a group. Before migration
// 017 a COMMIT sent as SQL text left the server in autocommit, where the output and the
// library's own COMMIT went through: counted Fresh, acked, an output without its claim.
//
// What stays uncovered on such a pool (README, "Where it stops"): after a COMMIT or ROLLBACK
// sent as SQL text, whose error the handler ignores, the server is outside any transaction, and
// the handler's own later statements run in autocommit; only a pool from pgtx.Open refuses them
// (its connection is doomed: pgx's wire guard). This test shows that write applied.
func TestHandlerEndingTheTxOnAPlainPool(t *testing.T) {
	t.Parallel()
	shared := pgtest.DB(t)
	plain, err := sql.Open("pgx", pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	require.False(t, pgwire.Guards(plain))
	for _, grouped := range []bool{false, true} {
		for _, ending := range pgtest.TxEndings {
			name := ending.Name + ", own tx"
			if grouped {
				name = ending.Name + ", group"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				schema := pgtest.Schema(t, shared)
				effects := pgtx.QualifiedName(schema, "effects")
				pgtest.Exec(t, shared, `CREATE TABLE `+effects+` (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL)`)
				cfg := once.Config{Schema: schema, Consumer: "c", OutputTopic: "out"}
				if grouped {
					cfg.GroupCommit = once.GroupCommitConfig{Workers: 1, TxBatchSize: 10, Linger: time.Millisecond}
				} else {
					cfg.GroupCommit.Disabled = true
				}
				mw, err := once.New(plain, cfg, nil)
				require.NoError(t, err)
				t.Cleanup(func() { _ = mw.Close() })
				h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
					tx, _ := pgtx.TxFromContext(msg.Context())
					if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+effects+` (key, amount) VALUES ('before', 1)`); err != nil {
						return nil, err
					}
					ending.End(tx)
					_, _ = tx.ExecContext(msg.Context(), `INSERT INTO `+effects+` (key, amount) VALUES ('after', 1)`)
					return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte(`{}`))}, nil
				})
				err = deliver(h, "m", "p")
				require.ErrorIs(t, err, wmonce.ErrHandlerEndedTx)
				require.True(t, wmonce.IsPermanent(err))
				require.Zero(t, pgtest.Count(t, shared, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")), "no claim")
				require.Zero(t, pgtest.Count(t, shared, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")), "no output")
				require.Zero(t, pgtest.Count(t, shared, `SELECT count(*) FROM `+effects+` WHERE key = 'before'`))
				require.Equal(t, uint64(1), mw.Counters().Consumer("c").HandlerEndedTx)
				require.Zero(t, mw.Counters().Consumer("c").Fresh)

				after := pgtest.Count(t, shared, `SELECT count(*) FROM `+effects+` WHERE key = 'after'`)
				if strings.Contains(ending.Name, "as text") {
					require.Equal(t, 1, after, "uncovered on a plain pool: a write after the ending runs in autocommit")
				} else {
					require.Zero(t, after)
				}
			})
		}
	}
}

// TestHandlerReturningTheGuardsRefusalIsParked: a handler that sends COMMIT as SQL text and
// returns the refusal's error (SQLSTATE WM002) is a handler that ended its transaction, on
// either guard: permanent, wmonce.ErrHandlerEndedTx, counted. Before, the refusal (P0001) was
// the handler's own transient failure: nacked forever, never parked.
func TestHandlerReturningTheGuardsRefusalIsParked(t *testing.T) {
	t.Parallel()
	shared := pgtest.DB(t)
	plain, err := sql.Open("pgx", pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	for name, db := range map[string]*sql.DB{"pgtx.Open pool": shared, "plain pool": plain} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			schema := pgtest.Schema(t, shared)
			mw, err := once.New(db, once.Config{Schema: schema, Consumer: "c"}, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = mw.Close() })
			h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				tx, _ := pgtx.TxFromContext(msg.Context())
				_, err := tx.ExecContext(msg.Context(), `COMMIT`)
				require.True(t, pgtx.IsAttemptGuardRefusal(err), "%v", err)
				return nil, err
			})
			err = deliver(h, "m", "p")
			require.ErrorIs(t, err, wmonce.ErrHandlerEndedTx)
			require.True(t, wmonce.IsPermanent(err))
			require.Equal(t, uint64(1), mw.Counters().Consumer("c").HandlerEndedTx)
			require.Zero(t, pgtest.Count(t, shared, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")))
		})
	}
}

// TestHandlerEndingTheSubscriberTxOnAPlainPool: watermill-sql's subscriber (v3 and v4) on a pool
// not from pgtx.Open, the middleware on one from it: a handler that ends the subscriber's
// transaction with SQL text applies nothing of the attempt, and the delivery fails with
// wmonce.ErrHandlerEndedTx (the server's guard decides in the subscriber's transaction, whatever
// the middleware's own pool). Its own later write runs in autocommit: uncovered on such a pool.
func TestHandlerEndingTheSubscriberTxOnAPlainPool(t *testing.T) {
	t.Parallel()
	for _, v := range []int{3, 4} {
		for _, ending := range pgtest.TxEndings {
			if !strings.Contains(ending.Name, "as text") {
				continue
			}
			t.Run(fmt.Sprintf("v%d, %s", v, ending.Name), func(t *testing.T) {
				t.Parallel()
				e := newPathEnv(t, txPath{name: "subscriber-tx", config: func(*once.Config) {}, subscriberTx: true, sql: v}, once.Config{Consumer: "c"})
				plain, err := sql.Open("pgx", pgtest.URL())
				require.NoError(t, err)
				t.Cleanup(func() { _ = plain.Close() })
				e.subDB = plain
				h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
					if _, err := e.effect(msg); err != nil {
						return nil, err
					}
					tx, _ := pgtx.TxFromContext(msg.Context())
					ending.End(tx)
					_, _ = tx.ExecContext(msg.Context(), `INSERT INTO `+e.table("effects")+` (key, amount) VALUES ('after', 1)`)
					return nil, nil
				})
				err = e.deliver(h, "m", "p")
				require.ErrorIs(t, err, wmonce.ErrHandlerEndedTx)
				require.Zero(t, e.claims(t))
				require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE key = 'm'`))
				require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE key = 'after'`), "uncovered on a plain pool")
			})
		}
	}
}
