package admin

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

//go:embed ui
var uiFS embed.FS

// WriteHeader is the request header every write (POST) must carry, with the value "1". A
// cross-site HTML form cannot set a header, and a cross-site fetch that sets one needs a CORS
// preflight this handler never grants, so a page on another origin cannot make the
// operator's browser replay or skip anything.
const WriteHeader = "X-Wmonce-Admin"

// Handler serves the admin page and its JSON API. It samples in the background (see
// Config.SampleInterval) until Close.
type Handler struct {
	db      *sql.DB
	config  Config
	ops     *inbox.Ops
	logger  watermill.LoggerAdapter
	mux     *http.ServeMux
	static  http.Handler
	history *history

	stop      context.CancelFunc
	stopped   chan struct{}
	closeOnce sync.Once
}

// NewHandler returns a Handler serving the admin page at "/" and its JSON API under "/api/"
// (mount it under a prefix with http.StripPrefix). Unless Config.SampleInterval is negative,
// it starts a goroutine that samples the inbox and the relays for the charts; Close stops it.
func NewHandler(db *sql.DB, config Config, logger watermill.LoggerAdapter) (*Handler, error) {
	logger, err := setup.Component(db, "admin: db is nil: open one with pgtx.Open", &config, (*Config).setDefaults, "admin: invalid config", logger)
	if err != nil {
		return nil, err
	}
	ops, err := inbox.NewOps(db, inbox.OpsConfig{Schema: config.Schema}, logger)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	ui, err := fs.Sub(uiFS, "ui")
	if err != nil {
		return nil, fmt.Errorf("admin: embedded page: %w", err)
	}
	h := &Handler{db: db, config: config, ops: ops, logger: logger, mux: http.NewServeMux(), static: http.FileServerFS(ui),
		history: newHistory(), stopped: make(chan struct{})}
	h.routes()
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	if config.SampleInterval > 0 {
		go h.sampleLoop(ctx)
	} else {
		close(h.stopped)
	}
	return h, nil
}

// Close stops the background sampling and waits for a sample in flight. The page and API keep
// working (their charts stop moving). Close is idempotent and always returns nil.
func (h *Handler) Close() error {
	h.closeOnce.Do(func() {
		h.stop()
		<-h.stopped
	})
	return nil
}

func (h *Handler) routes() {
	h.mux.HandleFunc("/{$}", h.page)
	h.mux.HandleFunc("/app.js", h.page)
	h.mux.HandleFunc("/style.css", h.page)
	h.mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path)
	})
	h.mux.HandleFunc("/api/status", h.get(h.status))
	h.mux.HandleFunc("/api/consumers", h.get(h.consumers))
	h.mux.HandleFunc("/api/inbox", h.get(h.inboxList))
	h.mux.HandleFunc("/api/inbox/stats", h.get(h.inboxStats))
	h.mux.HandleFunc("/api/inbox/{id}", h.get(h.inboxInspect))
	h.mux.HandleFunc("/api/outbox", h.get(h.outbox))
	h.mux.HandleFunc("/api/outbox/rejected", h.get(h.rejectedList))
	h.mux.HandleFunc("/api/outbox/rejected/{offset}", h.get(h.rejectedInspect))
	h.mux.HandleFunc("/api/history", h.get(h.historyGet))
	h.mux.HandleFunc("/api/dedupe", h.get(h.dedupe))
	h.mux.HandleFunc("/api/inbox/replay", h.write(h.inboxChange("replay")))
	h.mux.HandleFunc("/api/inbox/skip", h.write(h.inboxChange("skip")))
	h.mux.HandleFunc("/api/outbox/republish", h.write(h.republish))
	h.mux.HandleFunc("/api/outbox/forget", h.write(h.forget))
	h.mux.HandleFunc("/api/pause", h.write(h.pause))
	h.mux.HandleFunc("/api/failures", h.get(h.failureGroups))
	h.mux.HandleFunc("/api/failures/act", h.write(h.failureAct))
}

// ServeHTTP serves the page at "/" and the API under "/api/".
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "" {
		// Mounted with StripPrefix and asked for the prefix itself ("/wmonce"): the page's
		// relative links need the trailing slash. RequestURI still holds the unstripped path.
		target := "/"
		if u, err := url.ParseRequestURI(r.RequestURI); err == nil {
			target = u.Path + "/"
		}
		http.Redirect(w, r, target, http.StatusMovedPermanently)
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "no-referrer")
	h.mux.ServeHTTP(w, r)
}

// page serves the embedded page. Its Content-Security-Policy allows only this origin's
// scripts, styles and API: the page renders message payloads and errors, which come from
// producers, and must never run them.
func (h *Handler) page(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(w, http.StatusMethodNotAllowed, "use GET")
		return
	}
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	w.Header().Set("Cache-Control", "no-cache")
	h.static.ServeHTTP(w, r)
}

type apiFunc func(ctx context.Context, r *http.Request) (any, error)

// apiError carries an HTTP status for errors the caller can fix.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// badRequestIf is badRequest when bad holds, else nil: a request's checks, listed in the order
// operate.FirstError reads them.
func badRequestIf(bad bool, format string, args ...any) error {
	if bad {
		return badRequest(format, args...)
	}
	return nil
}

// inputError answers the first failed input rule (operate.CheckText, CheckConsumer) 400.
func inputError(errs ...error) error {
	if err := operate.FirstError(errs...); err != nil {
		return badRequest("%v", err)
	}
	return nil
}

func (h *Handler) get(f apiFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, "use GET")
			return
		}
		h.serve(w, r, f)
	}
}

// writeGuards are what a write must pass, in order: the first it fails answers it.
var writeGuards = []struct {
	refuse func(h *Handler, r *http.Request) bool
	status int
	msg    string
}{
	{func(_ *Handler, r *http.Request) bool { return r.Method != http.MethodPost }, http.StatusMethodNotAllowed, "use POST with a JSON body"},
	{func(h *Handler, _ *http.Request) bool { return !h.config.AllowWrites }, http.StatusForbidden,
		"the admin handler is read-only: set admin.Config.AllowWrites (wmonce admin -allow-writes) to enable replay and skip"},
	{func(_ *Handler, r *http.Request) bool { return r.Header.Get(WriteHeader) != "1" }, http.StatusForbidden,
		"writes must carry the header " + WriteHeader + ": 1 (it keeps other sites from triggering them)"},
	{func(_ *Handler, r *http.Request) bool { return r.Header.Get("Sec-Fetch-Site") == "cross-site" }, http.StatusForbidden, "cross-site writes are refused"},
	{func(_ *Handler, r *http.Request) bool { return !isJSON(r.Header.Get("Content-Type")) }, http.StatusUnsupportedMediaType, "send the request body as application/json"},
}

// write guards an endpoint that changes rows: writes enabled, POST, JSON body, WriteHeader.
func (h *Handler) write(f apiFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for _, g := range writeGuards {
			if g.refuse(h, r) {
				if g.status == http.StatusMethodNotAllowed {
					w.Header().Set("Allow", "POST")
				}
				writeError(w, g.status, g.msg)
				return
			}
		}
		// Every write's body is checked here, before its endpoint decodes it (decodeBody).
		body, err := readBody(r)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		h.serve(w, withBody(r, body), f)
	}
}

func isJSON(contentType string) bool {
	mediaType, _, _ := strings.Cut(contentType, ";")
	return mediaType == "application/json"
}

// serve answers an API request with f, after checking its query string (checkQuery), so no
// endpoint reads a parameter that is not text.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, f apiFunc) {
	if err := checkQuery(r.URL.RawQuery); err != nil {
		writeAPIError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.config.QueryTimeout)
	defer cancel()
	out, err := f(ctx, r)
	if err != nil {
		var ae *apiError
		switch {
		case errors.As(err, &ae):
			writeAPIError(w, ae)
		case operate.IsInputError(err): // the operations layer's checks of the request
			writeError(w, http.StatusBadRequest, err.Error())
		case errors.Is(err, inbox.ErrNotFound):
			writeError(w, http.StatusNotFound, err.Error())
		case pgtx.IsUndefinedTable(err):
			writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("%v: schema %s lacks watermill-once tables: %s", err, h.config.Schema, h.missingTableFix(ctx)))
		case errors.Is(err, context.DeadlineExceeded):
			writeError(w, http.StatusGatewayTimeout, fmt.Sprintf("the database did not answer within %s: %v", h.config.QueryTimeout, err))
		default:
			h.logger.Error("Admin request failed", err, watermill.LogFields{"path": r.URL.Path})
			writeError(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, ErrorBody{Error: msg})
}

// writeAPIError answers an *apiError with its status and message.
func writeAPIError(w http.ResponseWriter, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = &apiError{status: http.StatusInternalServerError, msg: err.Error()}
	}
	writeError(w, ae.status, ae.msg)
}

// missingTableFix says what to run when a table is missing: migrate up, unless the schema was
// built from printed SQL without version rows, where migrate up refuses to run until the
// versions are recorded (migrate.ErrUnrecordedSchema).
func (h *Handler) missingTableFix(ctx context.Context) string {
	if s, err := operate.ReadSchemaStatus(ctx, h.db, h.config.Schema); err == nil && s.Unrecorded {
		return s.Hint
	}
	return fmt.Sprintf("run `wmonce -schema %s migrate up`", h.config.Schema)
}
