package httpidem_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/httpidem"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// A response header that is not UTF-8 text used to be stored as JSON with U+FFFD in place of
// its bytes, so the replay differed from the response the client saw. It is now refused: the
// transaction rolls back and the client learns that nothing was stored or applied.
func TestResponseHeaderThatIsNotTextIsNotStoredAltered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	e.hook = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("X-Trace", "abc\xff")
		return true
	}
	first := e.post("bin-header", `{"amount":1}`)
	require.Equal(t, http.StatusInternalServerError, first.status)
	require.Equal(t, httpidem.ProblemNotStored, problemType(t, first))
	require.Zero(t, e.payments(), "rolled back")
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("http_idempotency_keys")))
}
