package httpidem

import (
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
	if !m.kept(rec, status) {
		// Nothing of ours follows the handler here: ask the guard whether it ended the
		// transaction (a kept response learns it from the guard's Close in commitTx).
		if !m.handlerEnded(ctx, w, tx, req, m.guard.Check(ctx, tx.Tx)) {
			m.answerUnstored(w, tx, req, rec, status, header)
		}
		return
	}
	if m.commitTx(ctx, w, tx, req) {
		writeResponse(w, status, header, rec.bytes(), false)
	}
}
