package idemkey

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/wmonce/watermill-once/internal/setup"
)

// defaultHeader is the header Stripe and the IETF Idempotency-Key draft use.
const defaultHeader = "Idempotency-Key"

// ErrMissingKey is returned by Transport for an unsafe request without a key.
var ErrMissingKey = errors.New("idemkey: request has no idempotency key")

// ErrConflictingKeys is returned by Transport for a request whose header carries two keys.
var ErrConflictingKeys = errors.New("idemkey: request carries conflicting idempotency keys")

type keyContextKey struct{}

// WithKey returns a context carrying key for Transport to send. An empty key removes it.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContextKey{}, key)
}

// KeyFromContext returns the key stored by WithKey.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyContextKey{}).(string)
	return k, ok && k != ""
}

// TransportConfig configures a Transport.
type TransportConfig struct {
	// Header carries the key. Default "Idempotency-Key".
	Header string
	// AllowMissingKey sends requests without a key unchanged. By default an unsafe request
	// (POST, PUT, PATCH, DELETE, ...) without one fails with ErrMissingKey, unsent.
	AllowMissingKey bool
}

func (c *TransportConfig) setDefaults() {
	c.Header = cmp.Or(c.Header, defaultHeader)
}

// Validate reports a header name that is not a valid HTTP token.
func (c TransportConfig) Validate() error {
	return setup.Check(setup.IsHTTPToken(c.Header), "Header %q is not a valid HTTP header name", c.Header)
}

// Transport is an http.RoundTripper that sends the key of the request's context (WithKey) as
// a header. A key the caller set in the header wins, under any spelling of its name; exactly
// one value is sent, and two different keys are refused (ErrConflictingKeys). It never mutates
// the request and does not retry: every retry of one context sends the same key.
type Transport struct {
	base   http.RoundTripper
	header string
	config TransportConfig
}

// NewTransport returns a Transport sending through base (http.DefaultTransport when nil).
func NewTransport(base http.RoundTripper, config TransportConfig) (*Transport, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("idemkey: invalid transport config: %w", err)
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{base: base, header: textproto.CanonicalMIMEHeaderKey(config.Header), config: config}, nil
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	explicit, names, err := t.explicitKey(req.Header)
	switch {
	case err != nil:
		return nil, t.refuse(req, fmt.Errorf("%w: %s %s: %w", ErrConflictingKeys, req.Method, req.URL.Redacted(), err))
	case explicit != "" && len(names) == 1 && len(req.Header[names[0]]) == 1:
		return t.base.RoundTrip(req) // one key, once: send as given
	}
	key, _ := KeyFromContext(req.Context())
	if key = cmp.Or(explicit, key); key == "" {
		return t.withoutKey(req)
	}
	// Leave exactly one value under the canonical name: a second spelling of the name in the
	// map would go on the wire as a second header.
	clone := req.Clone(req.Context())
	for _, n := range names {
		delete(clone.Header, n)
	}
	clone.Header.Set(t.header, key)
	return t.base.RoundTrip(clone)
}

// withoutKey sends a request that carries no key as it is, if it is safe or the config allows
// it, and refuses it otherwise.
func (t *Transport) withoutKey(req *http.Request) (*http.Response, error) {
	if t.config.AllowMissingKey || safeMethod(req.Method) {
		return t.base.RoundTrip(req)
	}
	return nil, t.refuse(req, fmt.Errorf("%w: %s %s: put one in the context with idemkey.WithKey (derive it with idemkey.Derive or idemkey.ForMessage) or set the %s header", ErrMissingKey, req.Method, req.URL.Redacted(), t.header))
}

// explicitKey returns the key the caller set in h under any spelling of the header name, the
// spellings present (with or without a value), and an error if they hold two different keys.
// Empty values count as no key.
func (t *Transport) explicitKey(h http.Header) (key string, names []string, err error) {
	for name, values := range h {
		if !strings.EqualFold(name, t.header) {
			continue
		}
		names = append(names, name)
		for _, v := range values {
			switch {
			case v == "" || v == key:
			case key == "":
				key = v
			default:
				return "", nil, fmt.Errorf("header %s holds both %q and %q", t.header, key, v)
			}
		}
	}
	return key, names, nil
}

// refuse closes the body of a request that is not sent, as the RoundTripper contract requires.
func (t *Transport) refuse(req *http.Request, err error) error {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	return err
}

func safeMethod(m string) bool {
	switch strings.ToUpper(m) {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true // "" means GET for http.Client
	}
	return false
}
