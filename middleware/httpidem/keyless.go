package httpidem

import (
	"fmt"
	"net/http"

	"github.com/ThreeDotsLabs/watermill"
)

// runKeyless serves a request without a key under AllowMissingKey: in a transaction, response held
// back until the commit, nothing stored.
func (m *Middleware) runKeyless(w http.ResponseWriter, r *http.Request, next http.Handler, body []byte) {
	req := &request{fields: watermill.LogFields{"method": r.Method, "path": r.URL.Path}}
	ctx := r.Context()
	tx, ok := m.begin(ctx, w, req)
	if !ok {
		return
	}
	defer tx.rollback()
	// No statement of ours precedes the handler: the guard's opening travels with its first.
	if err := m.guard.Open(ctx, tx.Tx); err != nil {
		tx.rollback()
		m.fail(w, err, "begin", req)
		return
	}
	rec := m.runHandler(next, r, tx, body)
	status, header := rec.final()
	if (rec.overflow || status >= 500 && !m.config.StoreServerErrors) && m.handlerEnded(ctx, w, tx, req, m.guard.Check(ctx, tx.Tx)) {
		return // otherwise the guard's Close tells, below
	}
	if rec.overflow {
		tx.rollback()
		m.fail(w, fmt.Errorf("response exceeded %d bytes", m.config.MaxResponseBytes), "buffer the response", req)
		return
	}
	if status >= 500 && !m.config.StoreServerErrors {
		tx.rollback()
		writeResponse(w, status, header, rec.bytes(), false)
		return
	}
	if !m.commitTx(ctx, w, tx, req) {
		return
	}
	writeResponse(w, status, header, rec.bytes(), false)
}
