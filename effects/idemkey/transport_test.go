package idemkey_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/effects/idemkey"
)

// recorder is the base RoundTripper: it keeps the request it was given.
type recorder struct {
	got   *http.Request
	calls atomic.Int32
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.calls.Add(1)
	r.got = req
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: req}, nil
}

// roundTrip sends req through rt and closes the response body, as every caller must.
func roundTrip(rt http.RoundTripper, req *http.Request) error {
	resp, err := rt.RoundTrip(req)
	if resp != nil {
		_ = resp.Body.Close()
	}
	return err
}

type trackedBody struct {
	io.Reader
	closed bool
}

func (b *trackedBody) Close() error { b.closed = true; return nil }

func TestTransportAttachesKeyFromContext(t *testing.T) {
	t.Parallel()
	base := &recorder{}
	tr, err := idemkey.NewTransport(base, idemkey.TransportConfig{})
	require.NoError(t, err)

	ctx := idemkey.WithKey(context.Background(), "k-123")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://provider.example/send", strings.NewReader("x"))
	req.Header.Set("X-Trace", "t")
	err = roundTrip(tr, req)
	require.NoError(t, err)
	require.Equal(t, "k-123", base.got.Header.Get("Idempotency-Key"))
	require.Equal(t, "t", base.got.Header.Get("X-Trace"))
	require.NotSame(t, req, base.got, "the transport sends a clone")
	require.Empty(t, req.Header.Get("Idempotency-Key"), "and leaves the caller's request untouched")
}

func TestTransportKeepsExplicitHeader(t *testing.T) {
	t.Parallel()
	base := &recorder{}
	tr, err := idemkey.NewTransport(base, idemkey.TransportConfig{})
	require.NoError(t, err)
	req, _ := http.NewRequestWithContext(idemkey.WithKey(context.Background(), "from-ctx"), http.MethodPost, "http://p/send", nil)
	req.Header.Set("Idempotency-Key", "explicit")
	err = roundTrip(tr, req)
	require.NoError(t, err)
	require.Equal(t, "explicit", base.got.Header.Get("Idempotency-Key"))
}

func TestTransportRefusesUnsafeRequestWithoutKey(t *testing.T) {
	t.Parallel()
	base := &recorder{}
	tr, err := idemkey.NewTransport(base, idemkey.TransportConfig{})
	require.NoError(t, err)

	body := &trackedBody{Reader: strings.NewReader("charge 100")}
	req, _ := http.NewRequest(http.MethodPost, "http://user:secret@p/send", body)
	err = roundTrip(tr, req)
	require.ErrorIs(t, err, idemkey.ErrMissingKey)
	require.NotContains(t, err.Error(), "secret", "credentials in the URL are redacted")
	require.True(t, body.closed, "a refused request's body is closed, as RoundTripper requires")
	require.Zero(t, base.calls.Load(), "nothing was sent")

	// Through an http.Client the error surfaces as the call's error.
	resp, err := (&http.Client{Transport: tr}).Post("http://p/send", "text/plain", strings.NewReader("x"))
	if resp != nil {
		_ = resp.Body.Close()
	}
	require.True(t, errors.Is(err, idemkey.ErrMissingKey), "got %v", err)

	// Safe methods need no key.
	req, _ = http.NewRequest(http.MethodGet, "http://p/status", nil)
	err = roundTrip(tr, req)
	require.NoError(t, err)
	require.Empty(t, base.got.Header.Get("Idempotency-Key"))

	// AllowMissingKey lets everything through unchanged.
	lax, err := idemkey.NewTransport(base, idemkey.TransportConfig{AllowMissingKey: true, Header: "X-Request-Id"})
	require.NoError(t, err)
	req, _ = http.NewRequest(http.MethodPost, "http://p/send", nil)
	err = roundTrip(lax, req)
	require.NoError(t, err)
	require.Same(t, req, base.got)

	req, _ = http.NewRequestWithContext(idemkey.WithKey(context.Background(), "k"), http.MethodPost, "http://p/send", nil)
	err = roundTrip(lax, req)
	require.NoError(t, err)
	require.Equal(t, "k", base.got.Header.Get("X-Request-Id"), "a custom header name is honoured")
}

func TestTransportConfigValidation(t *testing.T) {
	t.Parallel()
	for _, h := range []string{"Idempotency Key", "Key:", "ключ"} {
		_, err := idemkey.NewTransport(nil, idemkey.TransportConfig{Header: h})
		require.ErrorContains(t, err, "not a valid HTTP header name", h)
	}
	_, ok := idemkey.KeyFromContext(idemkey.WithKey(context.Background(), ""))
	require.False(t, ok, "an empty key counts as none")
}

// keyValues returns every value of name in h, under any spelling of the name: what goes on
// the wire, where header names are case-insensitive.
func keyValues(h http.Header, name string) []string {
	var out []string
	for k, v := range h {
		if strings.EqualFold(k, name) {
			out = append(out, v...)
		}
	}
	return out
}

// TestTransportNeverSendsTwoKeys: a key the caller set under a non-canonical map key
// (req.Header["idempotency-key"]) counts as the caller's key: it wins over the context's, it
// satisfies the missing-key check, and exactly one value is sent.
func TestTransportNeverSendsTwoKeys(t *testing.T) {
	t.Parallel()
	base := &recorder{}
	tr, err := idemkey.NewTransport(base, idemkey.TransportConfig{})
	require.NoError(t, err)
	withCtx := idemkey.WithKey(context.Background(), "from-ctx")

	for _, tc := range []struct {
		name   string
		ctx    context.Context
		header http.Header
		want   string
	}{
		{"lower-case explicit beats the context", withCtx, http.Header{"idempotency-key": {"explicit"}}, "explicit"},
		{"upper-case explicit beats the context", withCtx, http.Header{"IDEMPOTENCY-KEY": {"explicit"}}, "explicit"},
		{"lower-case explicit without a context key", context.Background(), http.Header{"idempotency-key": {"explicit"}}, "explicit"},
		{"one key under two spellings", withCtx, http.Header{"idempotency-key": {"explicit"}, "Idempotency-Key": {"explicit"}}, "explicit"},
		{"one key twice", withCtx, http.Header{"Idempotency-Key": {"explicit", "explicit"}}, "explicit"},
		{"empty explicit values count as none", withCtx, http.Header{"idempotency-key": {""}, "Idempotency-Key": {""}}, "from-ctx"},
	} {
		req, _ := http.NewRequestWithContext(tc.ctx, http.MethodPost, "http://p/send", strings.NewReader("x"))
		req.Header = tc.header.Clone()
		err := roundTrip(tr, req)
		require.NoError(t, err, tc.name)
		require.Equal(t, []string{tc.want}, keyValues(base.got.Header, "Idempotency-Key"), tc.name)
		require.Equal(t, tc.header, req.Header, "%s: the caller's request is untouched", tc.name)
	}

	// Two different explicit keys: nothing the transport could choose is safe; refuse.
	body := &trackedBody{Reader: strings.NewReader("x")}
	req, _ := http.NewRequestWithContext(withCtx, http.MethodPost, "http://p/send", body)
	req.Header = http.Header{"idempotency-key": {"a"}, "Idempotency-Key": {"b"}}
	calls := base.calls.Load()
	err = roundTrip(tr, req)
	require.ErrorIs(t, err, idemkey.ErrConflictingKeys)
	require.True(t, body.closed)
	require.Equal(t, calls, base.calls.Load(), "nothing was sent")

	// A custom header name is matched the same way.
	custom, err := idemkey.NewTransport(base, idemkey.TransportConfig{Header: "X-Request-Id"})
	require.NoError(t, err)
	req, _ = http.NewRequestWithContext(withCtx, http.MethodPost, "http://p/send", nil)
	req.Header = http.Header{"x-request-id": {"explicit"}}
	err = roundTrip(custom, req)
	require.NoError(t, err)
	require.Equal(t, []string{"explicit"}, keyValues(base.got.Header, "X-Request-Id"))
}
