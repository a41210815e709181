package httpidem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// Counters are the middleware's running totals.
type Counters struct {
	Stored     uint64 // first requests whose response was stored with their effects
	Replayed   uint64 // retries answered from a stored response
	Conflicts  uint64 // 409: the key's first request was still running
	Mismatches uint64 // 422: the key was used for a different request
	Refused    uint64 // 400 and 413: missing or invalid key, unscoped request, body too large
	NotStored  uint64 // 5xx responses rolled back and not stored (StoreServerErrors off)
	Keyless    uint64 // requests without a key run under AllowMissingKey
	Failed     uint64 // 500: the response could not be stored or the commit failed
	// HandlerEndedTx counts requests whose handler called Commit or Rollback on the request's
	// transaction: nothing of them was applied, no key was stored, and they were answered 500
	// (ProblemHandlerEndedTx). Also counted in Failed.
	HandlerEndedTx uint64
}

// Middleware implements Idempotency-Key handling. See the package documentation.
type Middleware struct {
	db      *sql.DB
	config  Config
	logger  watermill.LoggerAdapter
	tracer  trace.Tracer
	header  string
	methods []string
	fpHdrs  []string

	qLookup, qLock, qStore string
	guard                  txguard.Guard

	stored, replayed, conflicts, mismatches, refused, notStored, keyless, failed, endedTx atomic.Uint64
}

// NewMiddleware validates config and returns the middleware. The table must exist (run the
// migrations first).
func NewMiddleware(db *sql.DB, config Config, logger watermill.LoggerAdapter) (*Middleware, error) {
	config.Methods = slices.Clone(config.Methods)
	logger, err := setup.Component(db, "httpidem: db is nil: open one with pgtx.Open", &config, (*Config).setDefaults, "httpidem: invalid config", logger)
	if err != nil {
		return nil, err
	}
	fp := make([]string, len(config.FingerprintHeaders))
	for i, h := range config.FingerprintHeaders {
		fp[i] = textproto.CanonicalMIMEHeaderKey(h)
	}
	slices.Sort(fp)
	t := pgtx.QualifiedName(config.Schema, "http_idempotency_keys")
	return &Middleware{
		db:      db,
		config:  config,
		logger:  logger,
		tracer:  tracing.Tracer(config.TracerProvider),
		header:  textproto.CanonicalMIMEHeaderKey(config.Header),
		methods: config.Methods,
		fpHdrs:  slices.Compact(fp),
		guard:   txguard.New(config.Schema),
		// The key's lock opens the attempt guard as it goes (see internal/txguard): from here
		// until the middleware's own COMMIT, a COMMIT the handler sends is refused. AND: the
		// guard must open whenever the lock is taken; when it is not, the transaction ends.
		qLock: `SELECT pg_try_advisory_xact_lock($1) AND ` + txguard.Condition(config.Schema),
		qLookup: `SELECT fingerprint, response_status, response_headers::text, response_body, created_at FROM ` + t + `
WHERE scope = $1 AND idem_key = $2 AND created_at > now() - $3 * interval '1 microsecond'`,
		// The only row this may meet is an expired one (a live one was checked for under the
		// advisory lock), which the new response replaces.
		qStore: `INSERT INTO ` + t + ` (scope, idem_key, fingerprint, method, request_uri, response_status, response_headers, response_body)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8)
ON CONFLICT (scope, idem_key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, method = EXCLUDED.method,
    request_uri = EXCLUDED.request_uri, response_status = EXCLUDED.response_status,
    response_headers = EXCLUDED.response_headers, response_body = EXCLUDED.response_body, created_at = now()
WHERE ` + t + `.created_at <= now() - $9 * interval '1 microsecond'`,
	}, nil
}

// Counters returns the running totals.
func (m *Middleware) Counters() Counters {
	return Counters{
		Stored: m.stored.Load(), Replayed: m.replayed.Load(), Conflicts: m.conflicts.Load(),
		Mismatches: m.mismatches.Load(), Refused: m.refused.Load(), NotStored: m.notStored.Load(),
		Keyless: m.keyless.Load(), Failed: m.failed.Load(), HandlerEndedTx: m.endedTx.Load(),
	}
}

// Prune deletes stored responses older than Retention, in batches of 1000, and returns
// how many it deleted (the package function Prune does the work). Run it periodically
// (hourly is plenty), or let the retention janitor do it (retention.Config.HTTPKeysKeep);
// lookups ignore expired rows anyway, so it bounds the table's size, not correctness.
func (m *Middleware) Prune(ctx context.Context) (int64, error) {
	return Prune(ctx, m.db, m.config.Schema, pgtx.PruneRequest{Keep: m.config.Retention})
}

// Handler wraps next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(m.methods, r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		m.traced(w, r, func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	})
}

// request is what the middleware knows about one request under a key.
type request struct {
	scope, key  string
	fingerprint []byte
	body        []byte
	fields      watermill.LogFields
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, present, err := m.parseKey(r)
	if err != nil {
		m.refused.Add(1)
		writeProblem(w, http.StatusBadRequest, ProblemInvalidKey, "Invalid "+m.header, err.Error())
		return
	}
	if !present && !m.config.AllowMissingKey {
		m.refused.Add(1)
		writeProblem(w, http.StatusBadRequest, ProblemMissingKey, m.header+" is missing",
			fmt.Sprintf("%s %s must carry an %s header (a unique value per operation, up to %d characters, e.g. a UUID) so that retrying it is safe.", r.Method, r.URL.Path, m.header, m.config.MaxKeyLength))
		return
	}
	body, err := m.readBody(w, r)
	if err != nil {
		m.refused.Add(1)
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeProblem(w, http.StatusRequestEntityTooLarge, ProblemTooLarge, "Request body too large", fmt.Sprintf("the body exceeds %d bytes", m.config.MaxRequestBytes))
			return
		}
		writeProblem(w, http.StatusBadRequest, ProblemBadBody, "Unreadable request body", err.Error())
		return
	}
	if !present {
		m.keyless.Add(1)
		m.runKeyless(w, r, next, body)
		return
	}
	scope, err := m.config.Scope(r)
	if err == nil {
		err = checkScope(scope)
	}
	if err != nil {
		m.refused.Add(1)
		writeProblem(w, http.StatusBadRequest, ProblemNoScope, "Cannot scope "+m.header, "idempotency keys are kept per client and this request's client could not be determined: "+err.Error())
		return
	}
	req := &request{scope: scope, key: key, body: body, fingerprint: m.fingerprint(r, body),
		fields: watermill.LogFields{"idempotency_key": key, "method": r.Method, "path": r.URL.Path}}
	m.runKeyed(w, r, next, req)
}

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

	var locked bool
	if err := tx.QueryRowContext(ctx, m.qLock, m.lockKey(req)).Scan(&locked); err != nil {
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
	if (rec.overflow || status >= 500 && !m.config.StoreServerErrors) && m.handlerEnded(ctx, w, tx, req, m.guard.Check(ctx, tx.Tx)) {
		return // otherwise the store or the guard's Close tells, below
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
	res, err := tx.ExecContext(ctx, m.qStore, req.scope, req.key, req.fingerprint, r.Method, truncate(r.URL.RequestURI(), 2048),
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
	if !m.closeGuard(ctx, w, tx, req) {
		return
	}
	if err := tx.commit(); err != nil {
		// The outcome of a failed COMMIT can be unknown; either way a retry is safe: it finds
		// the stored response or runs afresh.
		m.fail(w, err, "commit", req)
		return
	}
	m.stored.Add(1)
	writeResponse(w, status, header, rec.bytes(), false)
}

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
	if !m.closeGuard(ctx, w, tx, req) {
		return
	}
	if err := tx.commit(); err != nil {
		m.fail(w, err, "commit", req)
		return
	}
	writeResponse(w, status, header, rec.bytes(), false)
}

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

// storedResponse is a live record of a key.
type storedResponse struct {
	fingerprint []byte
	status      int
	header      http.Header
	body        []byte
	createdAt   time.Time
}

// lookup returns the live record of the request's key, or nil.
func (m *Middleware) lookup(ctx context.Context, q pgtx.Executor, req *request) (*storedResponse, error) {
	var s storedResponse
	var headersJSON string
	err := q.QueryRowContext(ctx, m.qLookup, req.scope, req.key, m.config.Retention.Microseconds()).
		Scan(&s.fingerprint, &s.status, &headersJSON, &s.body, &s.createdAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		if pgtx.IsUndefinedTable(err) {
			return nil, fmt.Errorf("table http_idempotency_keys is missing in schema %q: run the migrations: %w", m.config.Schema, err)
		}
		return nil, err
	}
	if s.header, err = decodeHeaders([]byte(headersJSON)); err != nil {
		return nil, fmt.Errorf("decode stored headers: %w", err)
	}
	return &s, nil
}

// answerStored replays the stored response, or refuses a request that reuses its key.
func (m *Middleware) answerStored(w http.ResponseWriter, req *request, s *storedResponse) {
	if !bytes.Equal(s.fingerprint, req.fingerprint) {
		m.mismatches.Add(1)
		m.logger.Info("Idempotency key reused for a different request", req.fields.Add(watermill.LogFields{"first_used": s.createdAt}))
		writeProblem(w, http.StatusUnprocessableEntity, ProblemKeyReused, m.header+" already used for a different request",
			fmt.Sprintf("the key was first used at %s with a different method, path or body; use a new key for a new request", s.createdAt.UTC().Format(time.RFC3339)))
		return
	}
	m.replayed.Add(1)
	m.logger.Debug("Replaying stored response", req.fields.Add(watermill.LogFields{"status": s.status}))
	writeResponse(w, s.status, s.header, s.body, true)
}

// handlerEnded answers the request and reports true if its handler ended the request's
// transaction (Commit or Rollback on it), as err says: the error of txguard.Check or of a
// statement the middleware sent in the transaction after the handler returned. A transaction
// that the request's context ended (the client went away) is nobody's fault: false.
//
// The check costs nothing on the common path: the store of the response (keyed) or the guard's
// Close (keyless) tells. Only a response that is not stored asks txguard.Check.
func (m *Middleware) handlerEnded(ctx context.Context, w http.ResponseWriter, tx *requestTx, req *request, err error) bool {
	if !errors.Is(err, wmonce.ErrHandlerEndedTx) && !(errors.Is(err, sql.ErrTxDone) && ctx.Err() == nil) {
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

// closeGuard closes the attempt guard before the middleware's COMMIT (it travels with it on a
// pool from pgtx.Open). When it cannot, it answers the request and returns false.
func (m *Middleware) closeGuard(ctx context.Context, w http.ResponseWriter, tx *requestTx, req *request) bool {
	err := m.guard.Close(ctx, tx.Tx)
	if err == nil || m.handlerEnded(ctx, w, tx, req, err) {
		return err == nil
	}
	tx.rollback()
	m.fail(w, err, "commit", req)
	return false
}

func (m *Middleware) fail(w http.ResponseWriter, err error, what string, req *request) {
	m.failed.Add(1)
	m.logger.Error("Idempotent request failed: could not "+what, err, req.fields)
	writeProblem(w, http.StatusInternalServerError, ProblemNotStored, "Request not completed",
		"the server could not "+what+"; nothing was applied unless a retry with the same key says otherwise")
}

// parseKey returns the key, whether the header was present, and an error for an unusable one.
// Both a bare token (Stripe) and a quoted Structured Field string (IETF draft) are accepted.
func (m *Middleware) parseKey(r *http.Request) (string, bool, error) {
	values := r.Header.Values(m.header)
	if len(values) == 0 {
		return "", false, nil
	}
	if len(values) > 1 {
		return "", true, fmt.Errorf("%s must appear once; it appears %d times", m.header, len(values))
	}
	v := strings.TrimSpace(values[0])
	if strings.HasPrefix(v, `"`) {
		s, err := unquoteSFString(v)
		if err != nil {
			return "", true, fmt.Errorf("%s is not a valid quoted string: %w", m.header, err)
		}
		v = s
	} else {
		for i := 0; i < len(v); i++ {
			if v[i] <= ' ' || v[i] >= 0x7f {
				return "", true, fmt.Errorf("%s may contain only visible ASCII characters (or be a quoted string)", m.header)
			}
		}
	}
	switch {
	case v == "":
		return "", true, fmt.Errorf("%s is empty", m.header)
	case len(v) > m.config.MaxKeyLength:
		return "", true, fmt.Errorf("%s is %d characters long; the limit is %d", m.header, len(v), m.config.MaxKeyLength)
	}
	return v, true, nil
}

// unquoteSFString decodes an RFC 8941 sf-string: printable ASCII between double quotes, with
// only \" and \\ as escapes.
func unquoteSFString(s string) (string, error) {
	if len(s) < 2 || s[len(s)-1] != '"' {
		return "", errors.New("missing closing quote")
	}
	var b strings.Builder
	inner := s[1 : len(s)-1]
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '\\':
			i++
			if i == len(inner) || (inner[i] != '"' && inner[i] != '\\') {
				return "", errors.New(`only \" and \\ may be escaped`)
			}
			b.WriteByte(inner[i])
		case c == '"':
			return "", errors.New("unescaped quote inside the string")
		case c < 0x20 || c >= 0x7f:
			return "", errors.New("only printable ASCII is allowed")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

func checkScope(scope string) error {
	switch {
	case scope == "":
		return fmt.Errorf("%w: the scope function returned an empty scope", ErrNoScope)
	case len(scope) > 1024:
		return fmt.Errorf("the scope function returned %d bytes, over 1024: hash long scopes", len(scope))
	}
	return wmonce.CheckText("the scope returned by the scope function", scope)
}

func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, nil
	}
	defer r.Body.Close()
	return io.ReadAll(http.MaxBytesReader(w, r.Body, m.config.MaxRequestBytes))
}

// fingerprint identifies the request: method, path and query, the configured headers and the
// body, length-prefixed so that no two different requests encode alike.
func (m *Middleware) fingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	write := func(s []byte) {
		var n [binary.MaxVarintLen64]byte
		_, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		_, _ = h.Write(s)
	}
	write([]byte("watermill-once/httpidem/v1"))
	write([]byte(r.Method))
	write([]byte(r.URL.RequestURI()))
	for _, name := range m.fpHdrs {
		write([]byte(name))
		vals := r.Header.Values(name)
		write([]byte(strconv.Itoa(len(vals))))
		for _, v := range vals {
			write([]byte(v))
		}
	}
	write(body)
	return h.Sum(nil)
}

func (m *Middleware) lockKey(req *request) int64 {
	h := sha256.New()
	for _, s := range []string{"watermill-once/httpidem/lock", m.config.Schema, req.scope, req.key} {
		var n [binary.MaxVarintLen64]byte
		_, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		_, _ = h.Write([]byte(s))
	}
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8]))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
