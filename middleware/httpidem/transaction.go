package httpidem

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// requestTx is the transaction of one request. Every response is written after it has ended,
// so that the key's advisory lock is released before the client can send its next request.
type requestTx struct {
	*sql.Tx
	ended bool
}

// begin starts the request's transaction; when it cannot, it answers the request and returns
// false.
func (m *Middleware) begin(ctx context.Context, w http.ResponseWriter, req *request) (*requestTx, bool) {
	tx, err := m.db.BeginTx(ctx, m.config.TxOptions)
	if err != nil {
		m.fail(w, err, "begin", req)
		return nil, false
	}
	return &requestTx{Tx: tx}, true
}

// rollback ends the transaction unless it has ended already.
func (t *requestTx) rollback() {
	if !t.ended {
		t.ended = true
		_ = t.Rollback()
	}
}

// commit ends the transaction with COMMIT.
func (t *requestTx) commit() error {
	t.ended = true
	return t.Commit()
}

// runHandler runs next with tx in the request context and a body that can be read again. A
// panic rolls back (the caller's deferred rollback) and propagates to net/http.
func (m *Middleware) runHandler(next http.Handler, r *http.Request, tx *requestTx, body []byte) *recorder {
	rec := newRecorder(m.config.MaxResponseBytes)
	r2 := r.WithContext(pgtx.ContextWithTx(r.Context(), tx.Tx))
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	defer func() {
		if v := recover(); v != nil {
			tx.rollback()
			panic(v)
		}
	}()
	next.ServeHTTP(rec, r2)
	return rec
}

// handlerEnded answers the request and reports true if its handler ended the request's
// transaction (Commit or Rollback on it), as err says: the error of txguard.Check or of a
// statement the middleware sent in the transaction after the handler returned. A transaction
// that the request's context ended (the client went away) is nobody's fault: false.
//
// The check costs nothing on the common path: the store of the response (keyed) or the guard's
// Close (keyless) tells. Only a response that is not stored asks txguard.Check.
func (m *Middleware) handlerEnded(ctx context.Context, w http.ResponseWriter, tx *requestTx, req *request, err error) bool {
	if !errors.Is(err, wmonce.ErrHandlerEndedTx) && !txguard.IsEnded(ctx, err) {
		return false
	}
	tx.rollback() // database/sql has marked it done already; this only records it
	m.failed.Add(1)
	m.endedTx.Add(1)
	m.logger.Error("The handler ended the request's transaction (Commit or Rollback on the transaction from the context): nothing of it was applied, the key is not stored", err, req.fields)
	writeProblem(w, http.StatusInternalServerError, ProblemHandlerEndedTx, "The handler ended the request's transaction",
		"the handler committed or rolled back the transaction the middleware gave it; the middleware refused that commit, so nothing of the request was applied and its response was not stored. Retrying gets the same answer until the handler is fixed")
	return true
}

// commitTx closes the attempt guard and commits, the end of every request's transaction: the
// guard's close travels with COMMIT on a pool from pgtx.Open; a handler that ended the
// transaction is found there (handlerEnded answers it). It reports whether tx committed; when
// it did not, the request has been answered.
func (m *Middleware) commitTx(ctx context.Context, w http.ResponseWriter, tx *requestTx, req *request) bool {
	err := m.guard.Close(ctx, tx.Tx)
	if err != nil && m.handlerEnded(ctx, w, tx, req, err) {
		return false
	}
	if err == nil {
		err = tx.commit()
	} else {
		tx.rollback()
	}
	if err != nil {
		// The outcome of a failed COMMIT can be unknown; either way a retry is safe: it finds
		// the stored response or runs afresh.
		m.fail(w, err, "commit", req)
		return false
	}
	return true
}
