package httpidem_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/pgtx"
)

// TestHandlerEndingTheRequestTransactionAppliesNothing: a handler that writes, ends the
// request's transaction (Commit, Rollback, or both) and answers applies nothing, whatever it
// answers and with or without a key: the client gets 500 ProblemHandlerEndedTx, no key is
// stored, and a retry with the same key gets the same answer, never an effect. Before the
// attempt guard a committing handler's write was applied on every retry while each answer was
// a 500 saying nothing was applied.
func TestHandlerEndingTheRequestTransactionAppliesNothing(t *testing.T) {
	t.Parallel()
	for _, ending := range pgtest.TxEndings {
		for _, c := range []struct {
			name   string
			cfg    httpidem.Config
			key    string
			answer int // what the handler answers after ending the transaction
		}{
			{"keyed, 201", httpidem.Config{}, "k-1", http.StatusCreated},
			{"keyed, 503", httpidem.Config{}, "k-1", http.StatusServiceUnavailable},
			{"keyed, 503 under StoreServerErrors", httpidem.Config{StoreServerErrors: true}, "k-1", http.StatusServiceUnavailable},
			{"keyless, 201", httpidem.Config{AllowMissingKey: true}, "", http.StatusCreated},
			{"keyless, 503", httpidem.Config{AllowMissingKey: true}, "", http.StatusServiceUnavailable},
		} {
			t.Run(ending.Name+", "+c.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, c.cfg)
				e.hook = func(w http.ResponseWriter, r *http.Request) bool {
					if r.URL.Query().Has("fine") {
						return true
					}
					tx, _ := pgtx.TxFromContext(r.Context())
					ending.End(tx)
					// A write after the ending, its error ignored: it must not apply either.
					_, _ = tx.ExecContext(r.Context(), `INSERT INTO `+e.table("payments")+` (amount) VALUES (1)`)
					if c.answer >= 500 {
						http.Error(w, "ledger unavailable", c.answer)
						return false
					}
					return true
				}
				for range 2 {
					res := e.post(c.key, `{"amount":1}`)
					require.Equal(t, http.StatusInternalServerError, res.status, string(res.body))
					require.Equal(t, httpidem.ProblemHandlerEndedTx, problemType(t, res))
					require.Contains(t, string(res.body), "nothing of the request was applied")
				}
				require.Zero(t, e.payments(), "nothing applied, on no attempt")
				require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("http_idempotency_keys")))
				n := e.mw.Counters()
				require.Equal(t, uint64(2), n.HandlerEndedTx)
				require.Equal(t, uint64(2), n.Failed)
				require.Zero(t, n.Stored)

				// The next request, whose handler leaves the transaction alone, is applied.
				fineKey := ""
				if c.key != "" {
					fineKey = "k-2"
				}
				fine := e.do(http.MethodPost, "/payments?fine", fineKey, "client-a", `{"amount":1}`)
				require.Equal(t, http.StatusCreated, fine.status, string(fine.body))
				require.Equal(t, 1, e.payments())
			})
		}
	}
}
