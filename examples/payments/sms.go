package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
)

// fakeSMSProvider is an HTTP SMS API on 127.0.0.1 that honours Idempotency-Key the way real
// providers do: the first request with a key sends the SMS; a repeat with the same key and body
// gets the first answer back (Idempotent-Replayed: true) and sends nothing; the same key with
// another body is refused (422).
type fakeSMSProvider struct {
	srv *httptest.Server

	mu       sync.Mutex
	byKey    map[string]smsRecord
	sent     int
	requests int
}

type smsRecord struct {
	id       string
	bodyHash [32]byte
}

type smsRequest struct {
	To   string `json:"to"`
	Body string `json:"body"`
}

func newFakeSMSProvider() *fakeSMSProvider {
	p := &fakeSMSProvider{byKey: map[string]smsRecord{}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	return p
}

func (p *fakeSMSProvider) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var req smsRequest
	if r.Method != http.MethodPost || key == "" || json.NewDecoder(r.Body).Decode(&req) != nil {
		http.Error(w, "POST a JSON {to, body} with an Idempotency-Key header", http.StatusBadRequest)
		return
	}
	hash := sha256.Sum256([]byte(req.To + "\x00" + req.Body))
	p.mu.Lock()
	p.requests++
	rec, seen := p.byKey[key]
	if !seen {
		p.sent++ // the one place an SMS "leaves the building"
		rec = smsRecord{id: fmt.Sprintf("sms-%03d", p.sent), bodyHash: hash}
		p.byKey[key] = rec
	}
	p.mu.Unlock()
	if seen && rec.bodyHash != hash {
		http.Error(w, "Idempotency-Key reused with a different request", http.StatusUnprocessableEntity)
		return
	}
	if seen {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"id": rec.id})
}

// Send posts one SMS with the key and returns the provider's message id.
func (p *fakeSMSProvider) Send(ctx context.Context, key, to, body string) (id string, replayed bool, err error) {
	payload, _ := json.Marshal(smsRequest{To: to, Body: body})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.srv.URL+"/v1/sms", bytes.NewReader(payload))
	if err != nil {
		return "", false, err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.srv.Client().Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", false, fmt.Errorf("provider answered %s", resp.Status)
	}
	var out struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", false, err
	}
	return out.ID, resp.Header.Get("Idempotent-Replayed") == "true", nil
}

// Sent is how many SMS the provider really sent; Requests how many calls it answered.
func (p *fakeSMSProvider) Sent() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent
}

func (p *fakeSMSProvider) Requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests
}

func (p *fakeSMSProvider) Close() { p.srv.Close() }
