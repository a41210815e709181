package httpidem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// runKeyed serves a request under a key: a live record of the key is replayed; otherwise the
// key's advisory lock is taken, the handler runs in the request's transaction and its response is
// stored with its effects, in one commit, before the client sees it.
func (m *Middleware) runKeyed(w http.ResponseWriter, r *http.Request, next http.Handler, req *request) {
	ctx := r.Context()
	// A completed key is answered without a transaction or lock, so concurrent retries of a
	// finished request are all replayed rather than turned away with 409.
	if m.answerIfStored(ctx, w, req, nil) {
		return
	}
	tx, ok := m.begin(ctx, w, req)
	if !ok {
		return
	}
	defer tx.rollback()
	if !m.takeKey(ctx, w, tx, req) {
		return
	}
	// The first request may have committed between the lookup above and the lock.
	if m.answerIfStored(ctx, w, req, tx) {
		return
	}

	rec := m.runHandler(next, r, tx, req.body)
	status, header := rec.final()
	// Before anything else is sent: a handler that sent COMMIT or ROLLBACK as SQL text left the
	// server outside any transaction, where the store below would keep the response for good.
	// The check travels with the store on a pool from pgtx.Open (pgwire.DeferredPrefix), and
	// fails the store with it.
	if m.handlerEnded(ctx, w, tx, req, m.guard.Check(ctx, tx.Tx)) {
		return
	}
	if m.answerUnstored(w, tx, req, rec, status, header) {
		return
	}
	if !m.storeResponse(ctx, w, r, tx, req, rec, status, header) {
		return
	}
	if !m.commitTx(ctx, w, tx, req) {
		return
	}
	m.stored.Add(1)
	writeResponse(w, status, header, rec.bytes(), false)
}

// answerIfStored answers the request from the live stored record of its key, or with the
// lookup's error, and says whether it did. It looks up through tx when one is open, and rolls
// tx back before it answers.
func (m *Middleware) answerIfStored(ctx context.Context, w http.ResponseWriter, req *request, tx *requestTx) bool {
	var q pgtx.Executor = m.db
	if tx != nil {
		q = tx
	}
	prev, err := m.lookup(ctx, q, req)
	if err == nil && prev == nil {
		return false
	}
	if tx != nil {
		tx.rollback()
	}
	if err != nil {
		m.fail(w, err, "look up the key", req)
	} else {
		m.answerStored(w, req, prev)
	}
	return true
}

// takeKey opens the attempt guard and tries the key's advisory lock without waiting. It says
// whether the request holds the key; if not, it rolled tx back and answered (409 while another
// request holds it).
func (m *Middleware) takeKey(ctx context.Context, w http.ResponseWriter, tx *requestTx, req *request) bool {
	if m.guard.OnWire() { // else the lock opens the server's guard as it goes
		if err := m.guard.Open(ctx, tx.Tx); err != nil {
			tx.rollback()
			m.fail(w, err, "begin", req)
			return false
		}
	}
	var locked bool
	if err := tx.QueryRowContext(ctx, m.q.lock, m.lockKey(req)).Scan(&locked); err != nil {
		tx.rollback()
		if txguard.IsMissing(err) {
			err = fmt.Errorf("function attempt_begin (the attempt guard) is missing in schema %q: run the migrations: %w", m.config.Schema, err)
		}
		m.fail(w, err, "lock the key", req)
		return false
	}
	if !locked {
		tx.rollback()
		m.answerInProgress(w)
	}
	return locked
}

// answerInProgress answers 409 to a request whose key another request holds, with the
// Retry-After of the config.
func (m *Middleware) answerInProgress(w http.ResponseWriter) {
	m.conflicts.Add(1)
	w.Header().Set("Retry-After", strconv.Itoa(int(max(1, m.config.RetryAfter.Round(time.Second)/time.Second))))
	writeProblem(w, http.StatusConflict, ProblemInProgress, "A request with this "+m.header+" is still running",
		"retry later with the same key to get its response")
}

// kept reports whether a response is committed (and, under a key, stored): not one too large
// to store, nor a 5xx without StoreServerErrors.
func (m *Middleware) kept(rec *recorder, status int) bool {
	return !rec.overflow && (status < 500 || m.config.StoreServerErrors)
}

// answerUnstored rolls back and answers a response that is not kept: one too large to store
// (500), or a 5xx without StoreServerErrors (sent as it is, the key left free for a retry). It
// says whether it answered.
func (m *Middleware) answerUnstored(w http.ResponseWriter, tx *requestTx, req *request, rec *recorder, status int, header http.Header) bool {
	switch {
	case rec.overflow:
		tx.rollback()
		m.failed.Add(1)
		m.logger.Error("Response too large to store; rolled back", nil, req.fields.Add(watermill.LogFields{"max_response_bytes": m.config.MaxResponseBytes}))
		writeProblem(w, http.StatusInternalServerError, ProblemNotStored, "Response too large to store",
			fmt.Sprintf("the response exceeded %d bytes and could not be kept for replay; nothing was applied", m.config.MaxResponseBytes))
	case !m.kept(rec, status):
		tx.rollback()
		m.notStored.Add(1)
		m.logger.Info("Server error not stored; rolled back, the key stays free for a retry", req.fields.Add(watermill.LogFields{"status": status}))
		writeResponse(w, status, header, rec.bytes(), false)
	default:
		return false
	}
	return true
}

// storeResponse writes the response under the key in tx. It says whether it did; if not, it
// rolled tx back and answered.
func (m *Middleware) storeResponse(ctx context.Context, w http.ResponseWriter, r *http.Request, tx *requestTx, req *request, rec *recorder, status int, header http.Header) bool {
	headersJSON, err := encodeHeaders(header)
	if err != nil {
		tx.rollback()
		m.fail(w, err, "encode the response headers", req)
		return false
	}
	res, err := tx.ExecContext(ctx, m.q.store, req.scope, req.key, req.fingerprint, r.Method, truncate(r.URL.RequestURI(), 2048),
		status, string(headersJSON), rec.bytes(), m.config.Retention.Microseconds())
	if err == nil {
		if n, _ := res.RowsAffected(); n != 1 {
			// Only possible if something wrote the key without taking the lock.
			err = errors.New("a live record for the key appeared during the request")
		}
	} else if m.handlerEnded(ctx, w, tx, req, err) {
		return false
	}
	if err != nil {
		tx.rollback()
		m.fail(w, err, "store the response", req)
		return false
	}
	return true
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
