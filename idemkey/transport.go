package idemkey

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
)

// DefaultHeader is the header Stripe and the IETF Idempotency-Key draft use.
const DefaultHeader = "Idempotency-Key"

// ErrMissingKey is returned by Transport for an unsafe request without a key.
var ErrMissingKey = errors.New("idemkey: request has no idempotency key")

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
	// Header carries the key. Default DefaultHeader ("Idempotency-Key").
	Header string
	// AllowMissingKey lets requests through unchanged when neither the context nor the request
	// carries a key. By default a request with an unsafe method (POST, PUT, PATCH, DELETE, ...)
	// and no key fails with ErrMissingKey before anything is sent: a forgotten key would
	// otherwise repeat the effect on every redelivery without anyone noticing.
	AllowMissingKey bool
}

func (c *TransportConfig) setDefaults() {
	if c.Header == "" {
		c.Header = DefaultHeader
	}
}

// Validate reports a header name that is not a valid HTTP token.
func (c TransportConfig) Validate() error {
	if !validToken(c.Header) {
		return fmt.Errorf("Header %q is not a valid HTTP header name", c.Header)
	}
	return nil
}

// Transport is an http.RoundTripper that attaches the key from the request context (WithKey)
// as a header, then hands the request to Base.
//
// It never overwrites the header when the request already carries it (the caller's key wins),
// never mutates the request it is given (it sends a clone), and closes the request body when it
// refuses a request, as the RoundTripper contract requires. It does not retry: put your retry
// loop (or client) around it, and every retry of the same context sends the same key.
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
	if req.Header.Get(t.header) != "" {
		return t.base.RoundTrip(req)
	}
	key, ok := KeyFromContext(req.Context())
	if !ok {
		if t.config.AllowMissingKey || safeMethod(req.Method) {
			return t.base.RoundTrip(req)
		}
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("%w: %s %s: put one in the context with idemkey.WithKey (derive it with idemkey.Derive or idemkey.ForMessage) or set the %s header", ErrMissingKey, req.Method, req.URL.Redacted(), t.header)
	}
	clone := req.Clone(req.Context())
	clone.Header.Set(t.header, key)
	return t.base.RoundTrip(clone)
}

func safeMethod(m string) bool {
	switch strings.ToUpper(m) {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true // "" means GET for http.Client
	}
	return false
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r >= 0x80 || r <= ' ' || strings.ContainsRune("\"(),/:;<=>?@[\\]{}", r) || r == 0x7f {
			return false
		}
	}
	return true
}
