// Package fakeprovider is an in-process HTTP stand-in for an external provider (an SMS
// gateway, a payment API) that deduplicates on the Idempotency-Key header the way Stripe does:
// the first request with a key performs the effect and stores its answer, later requests with
// the same key get the stored answer back. Tests use it to see what crossed the network: how
// often each key arrived and how many effects happened.
//
// It replaces the remote service only; the database and brokers under test stay real.
package fakeprovider

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// Provider is a running fake provider.
type Provider struct {
	server *httptest.Server

	mu         sync.Mutex
	honourKeys bool
	calls      map[string]int    // key -> POST /send count
	sent       map[string]string // key -> provider id of the effect
	order      []string          // keys in arrival order
	effects    int
	failNext   int
	failStatus int
	lookups    int
	onSend     func(key string)
}

// Start runs a provider that honours idempotency keys and stops it when the test ends.
func Start(t testing.TB) *Provider {
	p := &Provider{
		honourKeys: true,
		calls:      map[string]int{},
		sent:       map[string]string{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /send", p.send)
	mux.HandleFunc("GET /lookup", p.lookup)
	p.server = httptest.NewServer(mux)
	t.Cleanup(p.server.Close)
	return p
}

// URL is the provider's base URL.
func (p *Provider) URL() string { return p.server.URL }

// Client returns an HTTP client for the provider (no idempotency transport of its own).
func (p *Provider) Client() *http.Client { return p.server.Client() }

// IgnoreKeys makes the provider perform an effect for every request, as a provider without
// idempotency support does.
func (p *Provider) IgnoreKeys() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.honourKeys = false
}

// FailNext answers the next n sends with status (e.g. 503) without performing anything.
func (p *Provider) FailNext(n, status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failNext, p.failStatus = n, status
}

// OnSend runs f after an effect was performed and before the answer is written: tests use it
// to crash the caller between the provider call and its commit.
func (p *Provider) OnSend(f func(key string)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onSend = f
}

// Calls returns how many POST /send requests carried key.
func (p *Provider) Calls(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[key]
}

// Keys returns the Idempotency-Key of every POST /send in arrival order ("" for none).
func (p *Provider) Keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.order...)
}

// Effects returns how many effects the provider performed.
func (p *Provider) Effects() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.effects
}

// Lookups returns how many GET /lookup requests arrived.
func (p *Provider) Lookups() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lookups
}

// SentID returns the provider id of the effect performed for key.
func (p *Provider) SentID(key string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.sent[key]
	return id, ok
}

// Response is the JSON the provider answers with.
type Response struct {
	ID       string `json:"id"`
	Replayed bool   `json:"replayed,omitempty"`
}

func (p *Provider) send(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	p.order = append(p.order, key)
	p.calls[key]++
	if p.failNext > 0 {
		p.failNext--
		status := p.failStatus
		p.mu.Unlock()
		http.Error(w, "provider unavailable", status)
		return
	}
	if id, ok := p.sent[key]; ok && key != "" && p.honourKeys {
		p.mu.Unlock()
		writeJSON(w, http.StatusOK, Response{ID: id, Replayed: true})
		return
	}
	p.effects++
	id := fmt.Sprintf("prov_%d", p.effects)
	if key != "" {
		p.sent[key] = id
	}
	onSend := p.onSend
	p.mu.Unlock()
	if onSend != nil {
		onSend(key)
	}
	writeJSON(w, http.StatusCreated, Response{ID: id})
}

func (p *Provider) lookup(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("reference")
	p.mu.Lock()
	p.lookups++
	id, ok := p.sent[ref]
	p.mu.Unlock()
	if !ok || ref == "" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	writeJSON(w, http.StatusOK, Response{ID: id})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
