package httpidem

import (
	"cmp"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

// Defaults of Config, stated in each field's doc.
const (
	defaultHeader           = "Idempotency-Key"
	defaultScopeHeader      = "Authorization"
	defaultRetention        = 24 * time.Hour // Stripe's
	defaultMaxRequestBytes  = 1 << 20
	defaultMaxResponseBytes = 1 << 20
	defaultIsolation        = sql.LevelReadCommitted
	defaultRetryAfter       = time.Second
)

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// ErrNoScope is returned by this package's ScopeFuncs for a request naming no client.
var ErrNoScope = errors.New("httpidem: the request does not identify its client")

// ScopeFunc returns the client scope of a request (keys are unique per scope); an error
// refuses the request with 400.
type ScopeFunc func(r *http.Request) (string, error)

// ScopeFromHeader scopes keys by a request header's SHA-256 (an API key, Authorization),
// refusing requests without it: only as trustworthy as the authentication in front.
func ScopeFromHeader(name string) ScopeFunc {
	name = textproto.CanonicalMIMEHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := r.Header.Get(name)
		if v == "" {
			return "", fmt.Errorf("%w: header %s is missing", ErrNoScope, name)
		}
		sum := sha256.Sum256([]byte(v))
		return "sha256:" + hex.EncodeToString(sum[:]), nil
	}
}

// SharedScope puts every client in one scope: only where keys are unique across clients,
// or a retry may get another client's response.
func SharedScope() ScopeFunc {
	return func(*http.Request) (string, error) { return "*", nil }
}

// Config configures the middleware.
type Config struct {
	// Schema holds the http_idempotency_keys table. Default pgtx.DefaultSchema.
	Schema string
	// Header carries the key. Default "Idempotency-Key".
	Header string
	// Methods are the request methods the middleware handles; others pass through untouched.
	// Default POST and PATCH.
	Methods []string
	// AllowMissingKey lets requests without a key run (in a transaction, with the response held
	// back until the commit) without being stored. By default a missing key is a 400.
	AllowMissingKey bool
	// Scope returns the client scope of a request. Default ScopeFromHeader("Authorization").
	Scope ScopeFunc
	// Retention is how long a stored response answers retries. Default 24h (Stripe's). Keep it
	// longer than any client retries: a retry after it runs the request again.
	Retention time.Duration
	// StoreServerErrors stores 5xx responses and replays them. Default false: a 5xx rolls the
	// transaction back and leaves the key free for a retry.
	StoreServerErrors bool
	// MaxKeyLength refuses longer keys with 400. Default 255 (Stripe's), at most 1024.
	MaxKeyLength int
	// MaxRequestBytes bounds the request body read for the fingerprint. Default 1 MiB.
	MaxRequestBytes int64
	// MaxResponseBytes bounds the buffered and stored response body. Default 1 MiB.
	MaxResponseBytes int64
	// FingerprintHeaders are request headers that belong to the request's identity besides the
	// method, path, query and body (e.g. "Content-Type", "Stripe-Account"). Default none.
	FingerprintHeaders []string
	// TxOptions for the request's transaction. Default: READ COMMITTED; never ReadOnly.
	TxOptions *sql.TxOptions
	// RetryAfter is advertised with 409 responses. Default 1s.
	RetryAfter time.Duration
	// TracerProvider traces each request handled. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	c.Header = cmp.Or(c.Header, defaultHeader)
	if c.Methods == nil {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if c.Scope == nil {
		c.Scope = ScopeFromHeader(defaultScopeHeader)
	}
	c.Retention = cmp.Or(c.Retention, defaultRetention)
	c.MaxKeyLength = cmp.Or(c.MaxKeyLength, setup.DefaultMaxKeyLength)
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, defaultMaxRequestBytes)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, defaultMaxResponseBytes)
	if c.TxOptions == nil {
		c.TxOptions = &sql.TxOptions{Isolation: defaultIsolation}
	}
	c.RetryAfter = cmp.Or(c.RetryAfter, defaultRetryAfter)
}

// Validate reports what to fix in a configuration.
func (c Config) Validate() error {
	return errors.Join(
		pgtx.ValidateIdentifier("schema", c.Schema),
		setup.CheckMaxKeyLength(c.MaxKeyLength),
		setup.NotNegative("RetryAfter", c.RetryAfter),
		pgtx.CheckTxOptions("TxOptions", c.TxOptions),
		setup.Check(setup.IsHTTPToken(c.Header), "Header %q is not a valid HTTP header name", c.Header),
		setup.Check(len(c.Methods) > 0, "Methods is empty: the middleware would do nothing; leave it nil for POST and PATCH"),
		setup.Each(c.Methods, checkMethod),
		setup.Check(c.Retention >= time.Second, "Retention must be at least 1s (Stripe keeps keys 24h), got %s", c.Retention),
		setup.Positive("MaxRequestBytes", c.MaxRequestBytes),
		setup.Positive("MaxResponseBytes", c.MaxResponseBytes),
		setup.Each(c.FingerprintHeaders, func(h string) error {
			return setup.Check(setup.IsHTTPToken(h), "FingerprintHeaders: %q is not a valid header name", h)
		}),
	)
}

// checkMethod refuses a method that is not an upper-case HTTP token: the middleware compares
// methods as the server received them.
func checkMethod(m string) error {
	return setup.Check(setup.IsHTTPToken(m) && strings.ToUpper(m) == m, "method %q is not an upper-case HTTP method token", m)
}
