package versioned_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/versioned"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// wrappedTx is a pgtx.Executor that is not a *sql.Tx: versioned cannot ask it whether it ended.
type wrappedTx struct{ *sql.Tx }

// TestApplyEndingTheTransactionIsPermanent: an apply function that ends the handler's
// transaction (or a handler that ended it before the call) gets a permanent error wrapping
// wmonce.ErrHandlerEndedTx from ApplyDelta and ApplyState, not a confusing later one, and
// nothing is applied: neither apply's write nor the version. With an Executor that is not a
// *sql.Tx, versioned cannot tell and reports Applied; the middleware still finds out and
// applies nothing.
func TestApplyEndingTheTransactionIsPermanent(t *testing.T) {
	t.Parallel()
	for _, ending := range pgtest.TxEndings {
		for _, c := range []struct {
			name    string
			state   bool // ApplyState, else ApplyDelta
			before  bool // the handler ends the transaction before the call, else apply does
			wrapped bool // pass the transaction as an Executor that is not a *sql.Tx
			says    string
		}{
			{name: "delta, in apply", says: "ended the caller's transaction"},
			{name: "state, in apply", state: true, says: "ended the caller's transaction"},
			{name: "delta, before the call", before: true, says: "record account/a version 1"},
			{name: "state, before the call", state: true, before: true, says: "record account/a version 1"},
			{name: "delta, in apply, wrapped", wrapped: true},
		} {
			t.Run(ending.Name+", "+c.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				pgtest.Exec(t, e.db, `CREATE TABLE `+e.table("balances")+` (account text PRIMARY KEY, paise bigint NOT NULL)`)
				var res versioned.Result
				var got error
				h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
					tx, _ := pgtx.TxFromContext(msg.Context())
					var q pgtx.Executor = tx
					if c.wrapped {
						q = wrappedTx{tx}
					}
					if c.before {
						ending.End(tx)
					}
					apply := func(ctx context.Context) error {
						_, err := tx.ExecContext(ctx, `INSERT INTO `+e.table("balances")+` VALUES ('a', 100)`)
						if !c.before {
							ending.End(tx)
						}
						return err
					}
					ent := versioned.Entity{Type: "account", ID: "a"}
					if c.state {
						res, got = e.v.ApplyState(msg.Context(), q, ent, 1, apply)
					} else {
						res, got = e.v.ApplyDelta(msg.Context(), q, ent, 1, apply)
					}
					return nil, got
				})
				err := deliver(t, h, "m-1", event{Account: "a", Version: 1, Add: 100})
				if c.wrapped {
					require.NoError(t, got)
					require.Equal(t, versioned.Applied, res.Outcome)
				} else {
					require.ErrorIs(t, got, wmonce.ErrHandlerEndedTx)
					require.True(t, wmonce.IsPermanent(got))
					require.ErrorContains(t, got, c.says)
				}
				require.ErrorIs(t, err, wmonce.ErrHandlerEndedTx, "the middleware's answer")
				require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("balances")))
				require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("entity_versions")))
			})
		}
	}
}
