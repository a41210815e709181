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

	"github.com/wmonce/watermill-once/idemkey"
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
	_, err = tr.RoundTrip(req)
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
	_, err = tr.RoundTrip(req)
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
	_, err = tr.RoundTrip(req)
	require.ErrorIs(t, err, idemkey.ErrMissingKey)
	require.NotContains(t, err.Error(), "secret", "credentials in the URL are redacted")
	require.True(t, body.closed, "a refused request's body is closed, as RoundTripper requires")
	require.Zero(t, base.calls.Load(), "nothing was sent")

	// Through an http.Client the error surfaces as the call's error.
	_, err = (&http.Client{Transport: tr}).Post("http://p/send", "text/plain", strings.NewReader("x"))
	require.True(t, errors.Is(err, idemkey.ErrMissingKey), "got %v", err)

	// Safe methods need no key.
	req, _ = http.NewRequest(http.MethodGet, "http://p/status", nil)
	_, err = tr.RoundTrip(req)
	require.NoError(t, err)
	require.Empty(t, base.got.Header.Get("Idempotency-Key"))

	// AllowMissingKey lets everything through unchanged.
	lax, err := idemkey.NewTransport(base, idemkey.TransportConfig{AllowMissingKey: true, Header: "X-Request-Id"})
	require.NoError(t, err)
	req, _ = http.NewRequest(http.MethodPost, "http://p/send", nil)
	_, err = lax.RoundTrip(req)
	require.NoError(t, err)
	require.Same(t, req, base.got)

	req, _ = http.NewRequestWithContext(idemkey.WithKey(context.Background(), "k"), http.MethodPost, "http://p/send", nil)
	_, err = lax.RoundTrip(req)
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
