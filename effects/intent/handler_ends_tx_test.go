package intent_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// TestRecordAfterTheHandlerEndedItsTransaction: recording an intent in a transaction the
// handler has already ended fails with a permanent error wrapping wmonce.ErrHandlerEndedTx
// that says so, not with a bare sql.ErrTxDone, and no intent is kept: not the one recorded
// before the end either (the attempt guard refused that COMMIT).
func TestRecordAfterTheHandlerEndedItsTransaction(t *testing.T) {
	t.Parallel()
	for _, ending := range pgtest.TxEndings {
		t.Run(ending.Name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			mw, err := once.New(e.db, once.Config{Schema: e.schema, Consumer: "notifications"}, nil)
			require.NoError(t, err)
			var got error
			h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				if _, err := e.store.Record(msg, intent.Draft{Channel: "sms", Payload: msg.Payload}); err != nil {
					return nil, err
				}
				tx, _ := pgtx.TxFromContext(msg.Context())
				ending.End(tx)
				_, got = e.store.Record(msg, intent.Draft{Channel: "email", Payload: msg.Payload})
				return nil, got
			})
			_, err = h(message.NewMessage("e-1", []byte("cashback")))
			require.ErrorIs(t, got, wmonce.ErrHandlerEndedTx)
			// database/sql's ErrTxDone after Commit or Rollback on the *sql.Tx; the attempt
			// guard's refusal after COMMIT or ROLLBACK sent as SQL text.
			require.True(t, errors.Is(got, sql.ErrTxDone) || pgtx.IsAttemptGuardRefusal(got), "%v", got)
			require.True(t, wmonce.IsPermanent(got))
			require.ErrorContains(t, got, "intent: record email/")
			require.ErrorIs(t, err, wmonce.ErrHandlerEndedTx, "the middleware's answer")
			require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+pgtx.QualifiedName(e.schema, "intents")))
		})
	}
}
