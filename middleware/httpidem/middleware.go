package httpidem

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// Counters are the middleware's running totals.
type Counters struct {
	Stored         uint64 // first requests whose response was stored with their effects
	Replayed       uint64 // retries answered from a stored response
	Conflicts      uint64 // 409: the key's first request was still running
	Mismatches     uint64 // 422: the key was used for a different request
	Refused        uint64 // 400 and 413: missing or invalid key, unscoped request, body too large
	NotStored      uint64 // 5xx responses rolled back and not stored (StoreServerErrors off)
	Keyless        uint64 // requests without a key run under AllowMissingKey
	Failed         uint64 // 500: the response could not be stored or the commit failed
	HandlerEndedTx uint64 // 500: the handler ended the transaction (also counted in Failed)
}

// Middleware implements Idempotency-Key handling, as the package doc says.
type Middleware struct {
	db      *sql.DB
	config  Config
	logger  watermill.LoggerAdapter
	tracer  trace.Tracer
	header  string
	methods []string
	fpHdrs  []string

	q     queries
	guard txguard.Guard

	stored, replayed, conflicts, mismatches, refused, notStored, keyless, failed, endedTx atomic.Uint64
}

// NewMiddleware validates config and returns the middleware (after the migrations).
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
	return &Middleware{
		db:      db,
		config:  config,
		logger:  logger,
		tracer:  tracing.Tracer(config.TracerProvider),
		header:  textproto.CanonicalMIMEHeaderKey(config.Header),
		methods: config.Methods,
		fpHdrs:  slices.Compact(fp),
		guard:   txguard.For(config.Schema, db),
		q:       newQueries(config.Schema, txguard.For(config.Schema, db).OnWire()),
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

// Prune deletes stored responses older than Retention (the function Prune), bounding the
// table's size: run it hourly, or set the janitor's HTTPKeysKeep.
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
		m.refuseBody(w, err)
		return
	}
	if !present {
		m.keyless.Add(1)
		m.runKeyless(w, r, next, body)
		return
	}
	scope, err := m.clientScope(r)
	if err != nil {
		m.refused.Add(1)
		writeProblem(w, http.StatusBadRequest, ProblemNoScope, "Cannot scope "+m.header, "idempotency keys are kept per client and this request's client could not be determined: "+err.Error())
		return
	}
	req := &request{scope: scope, key: key, body: body, fingerprint: m.fingerprint(r, body),
		fields: watermill.LogFields{"idempotency_key": key, "method": r.Method, "path": r.URL.Path}}
	m.runKeyed(w, r, next, req)
}

// fail answers a request the middleware could not complete with 500, counting and logging why.
func (m *Middleware) fail(w http.ResponseWriter, err error, what string, req *request) {
	m.failed.Add(1)
	m.logger.Error("Idempotent request failed: could not "+what, err, req.fields)
	writeProblem(w, http.StatusInternalServerError, ProblemNotStored, "Request not completed",
		"the server could not "+what+"; nothing was applied unless a retry with the same key says otherwise")
}

// refuseBody answers a request whose body could not be read: 413 over MaxRequestBytes, else 400.
func (m *Middleware) refuseBody(w http.ResponseWriter, err error) {
	m.refused.Add(1)
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeProblem(w, http.StatusRequestEntityTooLarge, ProblemTooLarge, "Request body too large", fmt.Sprintf("the body exceeds %d bytes", m.config.MaxRequestBytes))
		return
	}
	writeProblem(w, http.StatusBadRequest, ProblemBadBody, "Unreadable request body", err.Error())
}

// clientScope returns the request's client scope (Config.Scope), refusing one that could not
// be stored or would make a poor index key.
func (m *Middleware) clientScope(r *http.Request) (string, error) {
	scope, err := m.config.Scope(r)
	if err != nil {
		return "", err
	}
	return scope, checkScope(scope)
}

// checkScope refuses a scope that could not be stored or would make a poor index key.
func checkScope(scope string) error {
	switch {
	case scope == "":
		return fmt.Errorf("%w: the scope function returned an empty scope", ErrNoScope)
	case len(scope) > 1024:
		return fmt.Errorf("the scope function returned %d bytes, over 1024: hash long scopes", len(scope))
	}
	return setup.CheckText("the scope returned by the scope function", scope)
}
