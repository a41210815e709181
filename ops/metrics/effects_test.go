package metrics_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/ops/metrics"
	"github.com/wmonce/watermill-once/pgtx"
)

// provider answers by payload, as a real provider answers by request: "ok" is sent, "reject"
// refused, "busy" not sent (retry later), "lost" an unknown outcome, "slow" waits for release.
type provider struct {
	entered, release chan struct{}
}

func (p *provider) Send(ctx context.Context, in intent.Intent) (string, error) {
	switch string(in.Payload) {
	case "reject":
		return "", wmonce.Permanent(errors.New("invalid number"))
	case "busy":
		return "", intent.NotSent(errors.New("429 too many requests"))
	case "lost":
		return "", errors.New("connection reset after the request was written")
	case "slow":
		p.entered <- struct{}{}
		select {
		case <-p.release:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	return "id-" + in.Key[:8], nil
}

// lookupProvider has performed every effect it is asked about.
type lookupProvider struct{ provider }

func (p *lookupProvider) Lookup(context.Context, intent.Intent) (string, bool, error) {
	return "found", true, nil
}

func record(t *testing.T, db *sql.DB, store *intent.Store, channel, eventID, payload string) string {
	t.Helper()
	var rec intent.Recorded
	err := pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		rec, err = store.RecordTx(ctx, tx, intent.Draft{Channel: channel, Consumer: "notifications", EventID: eventID, Payload: []byte(payload)})
		return err
	})
	require.NoError(t, err)
	return rec.Key
}

func labels(kv ...string) map[string]string {
	out := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func TestIntentSenderMetrics(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	store, err := intent.NewStore(db, intent.StoreConfig{Schema: schema})
	require.NoError(t, err)

	p := &provider{entered: make(chan struct{}), release: make(chan struct{})}
	sender, err := intent.NewSender(db, intent.SenderConfig{
		Schema: schema,
		Channels: map[string]intent.Channel{
			"sms":   {Provider: p, OnCrash: intent.Resend},
			"email": {Provider: p, OnCrash: intent.Skip},
			"pay":   {Provider: &lookupProvider{*p}},
			"push":  {Provider: p, OnCrash: intent.Resend},
		},
		Backoff: time.Hour, // a retried intent stays PENDING for the scrape
	}, logger())
	require.NoError(t, err)

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{DB: db, Schema: schema, Senders: []*intent.Sender{sender}}))
	get := func(name string, kv ...string) float64 { return value(t, reg, name, labels(kv...)) }

	// Before anything happened: counters at 0, the Sender's channels at 0 rather than absent.
	require.Equal(t, 0.0, get("wmonce_intent_sent_total"))
	for _, channel := range []string{"sms", "email", "pay", "push"} {
		require.Equal(t, 0.0, get("wmonce_intent_rows", "channel", channel, "status", "pending"), channel)
	}
	require.Equal(t, 0.0, get("wmonce_scrape_errors_total", "source", "intent"))

	record(t, db, store, "sms", "e-1", "ok")
	record(t, db, store, "sms", "e-2", "ok")
	record(t, db, store, "sms", "e-3", "reject")
	busy := record(t, db, store, "sms", "e-4", "busy")
	record(t, db, store, "email", "e-5", "lost")
	record(t, db, store, "push", "e-6", "ok")
	require.Equal(t, 4.0, get("wmonce_intent_rows", "channel", "sms", "status", "pending"), "recorded, not sent yet")
	require.Equal(t, 0.0, get("wmonce_intent_retrying_rows", "channel", "sms"))

	n, err := sender.SendOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, n)

	require.Equal(t, 3.0, get("wmonce_intent_sent_total"))
	require.Equal(t, 1.0, get("wmonce_intent_retries_total"), "busy: NotSent")
	require.Equal(t, 1.0, get("wmonce_intent_unknown_outcomes_total"), "lost")
	require.Equal(t, 1.0, get("wmonce_intent_parked_total", "status", "failed"), "reject")
	require.Equal(t, 1.0, get("wmonce_intent_parked_total", "status", "skipped"), "lost on a Skip channel")
	require.Equal(t, 0.0, get("wmonce_intent_leases_expired_total"))
	require.Equal(t, 0.0, get("wmonce_intent_sender_errors_total"))

	require.Equal(t, 1.0, get("wmonce_intent_rows", "channel", "sms", "status", "pending"), "busy waits out its backoff")
	require.Equal(t, 1.0, get("wmonce_intent_retrying_rows", "channel", "sms"))
	require.Equal(t, 1.0, get("wmonce_intent_rows", "channel", "sms", "status", "failed"))
	require.Equal(t, 1.0, get("wmonce_intent_rows", "channel", "email", "status", "skipped"))
	require.Equal(t, 0.0, get("wmonce_intent_rows", "channel", "email", "status", "pending"))
	require.Equal(t, 0.0, get("wmonce_intent_rows", "channel", "push", "status", "pending"), "push drained: 0, not absent")
	require.Equal(t, 0.0, get("wmonce_intent_oldest_age_seconds", "channel", "push", "status", "pending"))

	// The age of the oldest PENDING intent, by the database clock.
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "intents")+` SET created_at = now() - interval '90 seconds' WHERE intent_key = $1`, busy)
	require.InDelta(t, 90, get("wmonce_intent_oldest_age_seconds", "channel", "sms", "status", "pending"), 60)

	// An intent in flight is SENDING while the provider works on it.
	record(t, db, store, "sms", "e-7", "slow")
	sent := make(chan error, 1)
	go func() { _, err := sender.SendNext(ctx); sent <- err }()
	<-p.entered
	require.Equal(t, 1.0, get("wmonce_intent_rows", "channel", "sms", "status", "sending"))
	require.GreaterOrEqual(t, get("wmonce_intent_oldest_age_seconds", "channel", "sms", "status", "sending"), 0.0)
	close(p.release)
	require.NoError(t, <-sent)
	require.Equal(t, 0.0, get("wmonce_intent_rows", "channel", "sms", "status", "sending"))
	require.Equal(t, 4.0, get("wmonce_intent_sent_total"))

	// A sender crashed mid-call on a Reconcile channel: the next one takes the expired lease
	// back and the lookup finds the effect, so it is not sent again.
	record(t, db, store, "pay", "e-8", "ok")
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "intents")+` SET status = 'SENDING', attempts = 1,
    claim_token = gen_random_uuid(), lease_until = now() - interval '1 second' WHERE channel = 'pay'`)
	require.Equal(t, 1.0, get("wmonce_intent_rows", "channel", "pay", "status", "sending"))
	did, err := sender.SendNext(ctx)
	require.NoError(t, err)
	require.True(t, did)
	require.Equal(t, 1.0, get("wmonce_intent_leases_expired_total"))
	require.Equal(t, 1.0, get("wmonce_intent_reconciled_total"))
	require.Equal(t, 5.0, get("wmonce_intent_sent_total"))
	require.Equal(t, 0.0, get("wmonce_intent_rows", "channel", "pay", "status", "sending"))

	require.Equal(t, 0.0, get("wmonce_scrape_errors_total", "source", "intent"))
	c, err := metrics.NewCollector(metrics.Sources{DB: db, Schema: schema, Senders: []*intent.Sender{sender}})
	require.NoError(t, err)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
}

// idemServer serves POST /payments through an Idempotency-Key middleware. The body decides
// what the handler does: "boom" answers 500, "big" answers more than the middleware stores,
// "hold" waits for release, "commits" commits the request's transaction itself after inserting;
// anything else inserts a payment.
type idemServer struct {
	mw               *httpidem.Middleware
	url              string
	entered, release chan struct{}
}

func newIdemServer(t *testing.T, db *sql.DB, schema string, cfg httpidem.Config) *idemServer {
	t.Helper()
	cfg.Schema = schema
	cfg.MaxResponseBytes = 64
	mw, err := httpidem.NewMiddleware(db, cfg, logger())
	require.NoError(t, err)
	s := &idemServer{mw: mw, entered: make(chan struct{}), release: make(chan struct{})}
	payments := pgtx.QualifiedName(schema, "payments")
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch string(body) {
		case "boom":
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		case "big":
			_, _ = w.Write([]byte(strings.Repeat("x", 100)))
			return
		case "hold":
			s.entered <- struct{}{}
			<-s.release
		}
		tx, _ := pgtx.TxFromContext(r.Context())
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO `+payments+` (body) VALUES ($1)`, string(body)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if string(body) == "commits" {
			_ = tx.Commit()
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewServer(mw.Handler(mux))
	t.Cleanup(srv.Close)
	s.url = srv.URL + "/payments"
	return s
}

func (s *idemServer) post(t *testing.T, key, body string) int {
	t.Helper()
	status, err := s.send(key, body)
	require.NoError(t, err)
	return status
}

func (s *idemServer) send(key, body string) (int, error) {
	req, err := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer client-1")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

func TestHTTPIdempotencyMetrics(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "payments")+` (id bigserial PRIMARY KEY, body text NOT NULL)`)
	strict := newIdemServer(t, db, schema, httpidem.Config{})
	optional := newIdemServer(t, db, schema, httpidem.Config{AllowMissingKey: true})

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{DB: db, Schema: schema, HTTPIdempotency: []*httpidem.Middleware{strict.mw, optional.mw}}))
	get := func(name string, kv ...string) float64 { return value(t, reg, name, labels(kv...)) }
	requests := func(result string) float64 { return get("wmonce_http_idempotency_requests_total", "result", result) }

	require.Equal(t, 0.0, requests("stored"))
	require.Equal(t, 0.0, get("wmonce_http_idempotency_keys"))
	require.Equal(t, 0.0, get("wmonce_http_idempotency_oldest_key_age_seconds"))

	require.Equal(t, http.StatusCreated, strict.post(t, "k-1", "a"))
	require.Equal(t, http.StatusCreated, strict.post(t, "k-1", "a"), "replayed")
	require.Equal(t, http.StatusUnprocessableEntity, strict.post(t, "k-1", "b"))
	require.Equal(t, http.StatusBadRequest, strict.post(t, "", "a"))
	require.Equal(t, http.StatusInternalServerError, strict.post(t, "k-2", "boom"))
	require.Equal(t, http.StatusInternalServerError, strict.post(t, "k-2", "boom"), "not stored: runs again")
	require.Equal(t, http.StatusInternalServerError, strict.post(t, "k-3", "big"))
	require.Equal(t, http.StatusCreated, optional.post(t, "", "c"))
	require.Equal(t, http.StatusCreated, optional.post(t, "k-4", "d"))
	require.Equal(t, http.StatusInternalServerError, strict.post(t, "k-6", "commits"))

	// 409 while the key's first request is still running.
	type answer struct {
		status int
		err    error
	}
	held := make(chan answer, 1)
	go func() { status, err := strict.send("k-5", "hold"); held <- answer{status, err} }()
	<-strict.entered
	require.Equal(t, http.StatusConflict, strict.post(t, "k-5", "hold"))
	close(strict.release)
	first := <-held
	require.NoError(t, first.err)
	require.Equal(t, http.StatusCreated, first.status)

	for result, want := range map[string]float64{
		"stored": 3, "duplicate": 1, "fingerprint_mismatch": 1, "refused": 1, "failed": 2, "error": 2,
		"keyless": 1, "conflict": 1,
	} {
		require.Equal(t, want, requests(result), result)
	}

	require.Equal(t, 1.0, get("wmonce_http_idempotency_handler_ended_tx_total"))

	// Stored keys: k-1, k-4, k-5. Exact before the table has statistics, then the estimate.
	require.Equal(t, 3.0, get("wmonce_http_idempotency_keys"))
	pgtest.Exec(t, db, `ANALYZE `+pgtx.QualifiedName(schema, "http_idempotency_keys"))
	require.Equal(t, 3.0, get("wmonce_http_idempotency_keys"))
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "http_idempotency_keys")+` SET created_at = now() - interval '1 hour' WHERE idem_key = 'k-1'`)
	require.InDelta(t, 3600, get("wmonce_http_idempotency_oldest_key_age_seconds"), 60)
	require.Equal(t, 0.0, get("wmonce_scrape_errors_total", "source", "http_idempotency"))

	c, err := metrics.NewCollector(metrics.Sources{DB: db, Schema: schema, HTTPIdempotency: []*httpidem.Middleware{strict.mw}})
	require.NoError(t, err)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems)
}
