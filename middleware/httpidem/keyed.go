package httpidem

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/txguard"
)

// runKeyed serves a request under a key: a live record of the key is replayed; otherwise the
// key's advisory lock is taken, the handler runs in the request's transaction and its response is
// stored with its effects, in one commit, before the client sees it.
func (m *Middleware) runKeyed(w http.ResponseWriter, r *http.Request, next http.Handler, req *request) {
	ctx := r.Context()

	// A completed key is answered without a transaction or lock, so concurrent retries of a
	// finished request are all replayed rather than turned away with 409.
	prev, err := m.lookup(ctx, m.db, req)
	if err != nil {
		m.fail(w, err, "look up the key", req)
		return
	}
	if prev != nil {
		m.answerStored(w, req, prev)
		return
	}

	tx, ok := m.begin(ctx, w, req)
	if !ok {
		return
	}
	defer tx.rollback()

	if m.guard.OnWire() { // else the lock opens the server's guard as it goes
		if err := m.guard.Open(ctx, tx.Tx); err != nil {
			tx.rollback()
			m.fail(w, err, "begin", req)
			return
		}
	}
	var locked bool
	if err := tx.QueryRowContext(ctx, m.q.lock, m.lockKey(req)).Scan(&locked); err != nil {
		tx.rollback()
		if txguard.IsMissing(err) {
			err = fmt.Errorf("function attempt_begin (the attempt guard) is missing in schema %q: run the migrations: %w", m.config.Schema, err)
		}
		m.fail(w, err, "lock the key", req)
		return
	}
	if !locked {
		tx.rollback()
		m.conflicts.Add(1)
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, m.config.RetryAfter.Round(time.Second)/time.Second))))
		writeProblem(w, http.StatusConflict, ProblemInProgress, "A request with this "+m.header+" is still running",
			"retry later with the same key to get its response")
		return
	}
	// The first request may have committed between the lookup above and the lock.
	prev, err = m.lookup(ctx, tx, req)
	if err != nil || prev != nil {
		tx.rollback()
		if err != nil {
			m.fail(w, err, "look up the key", req)
		} else {
			m.answerStored(w, req, prev)
		}
		return
	}

	rec := m.runHandler(next, r, tx, req.body)
	status, header := rec.final()
	// Before anything else is sent: a handler that sent COMMIT or ROLLBACK as SQL text left the
	// server outside any transaction, where the store below would keep the response for good.
	// The check travels with the store on a pool from pgtx.Open (pgtx.DeferredPrefix), and
	// fails the store with it.
	if m.handlerEnded(ctx, w, tx, req, m.guard.Check(ctx, tx.Tx)) {
		return
	}
	if rec.overflow {
		tx.rollback()
		m.failed.Add(1)
		m.logger.Error("Response too large to store; rolled back", nil, req.fields.Add(watermill.LogFields{"max_response_bytes": m.config.MaxResponseBytes}))
		writeProblem(w, http.StatusInternalServerError, ProblemNotStored, "Response too large to store",
			fmt.Sprintf("the response exceeded %d bytes and could not be kept for replay; nothing was applied", m.config.MaxResponseBytes))
		return
	}
	if status >= 500 && !m.config.StoreServerErrors {
		tx.rollback()
		m.notStored.Add(1)
		m.logger.Info("Server error not stored; rolled back, the key stays free for a retry", req.fields.Add(watermill.LogFields{"status": status}))
		writeResponse(w, status, header, rec.bytes(), false)
		return
	}
	headersJSON, err := encodeHeaders(header)
	if err != nil {
		tx.rollback()
		m.fail(w, err, "encode the response headers", req)
		return
	}
	res, err := tx.ExecContext(ctx, m.q.store, req.scope, req.key, req.fingerprint, r.Method, truncate(r.URL.RequestURI(), 2048),
		status, string(headersJSON), rec.bytes(), m.config.Retention.Microseconds())
	if err != nil && m.handlerEnded(ctx, w, tx, req, err) {
		return
	}
	if err == nil {
		if n, _ := res.RowsAffected(); n != 1 {
			// Only possible if something wrote the key without taking the lock.
			err = errors.New("a live record for the key appeared during the request")
		}
	}
	if err != nil {
		tx.rollback()
		m.fail(w, err, "store the response", req)
		return
	}
	if !m.commitTx(ctx, w, tx, req) {
		return
	}
	m.stored.Add(1)
	writeResponse(w, status, header, rec.bytes(), false)
}

// truncate cuts s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
