package httpidem_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

type env struct {
	t      *testing.T
	db     *sql.DB
	schema string
	mw     *httpidem.Middleware
	srv    *httptest.Server
	runs   atomic.Int32
	// hook runs inside the handler, after the payment row was written in the transaction.
	hook func(w http.ResponseWriter, r *http.Request) bool
}

func newEnv(t *testing.T, cfg httpidem.Config) *env {
	t.Helper()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "payments")+` (id bigserial PRIMARY KEY, amount bigint NOT NULL)`)
	cfg.Schema = schema
	mw, err := httpidem.NewMiddleware(db, cfg, watermill.NewStdLogger(false, false))
	require.NoError(t, err)
	e := &env{t: t, db: db, schema: schema, mw: mw}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", e.createPayment)
	mux.HandleFunc("GET /payments", func(w http.ResponseWriter, r *http.Request) {
		_, inTx := pgtx.TxFromContext(r.Context())
		fmt.Fprintf(w, "list (tx=%v)", inTx)
	})
	e.srv = httptest.NewServer(mw.Handler(mux))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *env) table(name string) string { return pgtx.QualifiedName(e.schema, name) }

// createPayment is an ordinary handler: it writes through the transaction in the request context.
func (e *env) createPayment(w http.ResponseWriter, r *http.Request) {
	e.runs.Add(1)
	tx, ok := pgtx.TxFromContext(r.Context())
	if !ok {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	var in struct {
		Amount int64 `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 {
		http.Error(w, "amount must be a positive integer", http.StatusBadRequest)
		return
	}
	var id int64
	if err := tx.QueryRowContext(r.Context(), `INSERT INTO `+e.table("payments")+` (amount) VALUES ($1) RETURNING id`, in.Amount).Scan(&id); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if e.hook != nil && !e.hook(w, r) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
	w.WriteHeader(http.StatusCreated)
	// Time-dependent output: a re-run would differ, so equal bodies prove a replay.
	fmt.Fprintf(w, `{"id":%d,"amount":%d,"created":%q}`+"\n", id, in.Amount, time.Now().Format(time.RFC3339Nano))
}

type result struct {
	status int
	header http.Header
	body   []byte
}

func (e *env) do(method, path, key, client, body string) result {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	require.NoError(e.t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if client != "" {
		req.Header.Set("Authorization", "Bearer "+client)
	}
	resp, err := e.srv.Client().Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return result{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *env) post(key, body string) result {
	return e.do(http.MethodPost, "/payments", key, "client-a", body)
}

func (e *env) payments() int {
	return pgtest.Count(e.t, e.db, `SELECT count(*) FROM `+e.table("payments"))
}

func problemType(t *testing.T, r result) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
		Title  string `json:"title"`
	}
	require.NoError(t, json.Unmarshal(r.body, &p), string(r.body))
	require.Equal(t, r.status, p.Status)
	require.NotEmpty(t, p.Title)
	return p.Type
}

func TestRetriedPostReplaysTheSameResponse(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	first := e.post("k-1", `{"amount":2400}`)
	require.Equal(t, http.StatusCreated, first.status, string(first.body))
	require.Empty(t, first.header.Get(httpidem.ReplayedHeader))

	for range 3 {
		again := e.post("k-1", `{"amount":2400}`)
		require.Equal(t, http.StatusCreated, again.status)
		require.Equal(t, first.body, again.body, "the body is replayed byte for byte")
		require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
		require.Equal(t, first.header.Get("Content-Type"), again.header.Get("Content-Type"))
		require.Equal(t, "true", again.header.Get(httpidem.ReplayedHeader))
	}
	require.Equal(t, 1, e.payments(), "one payment however often the client retries")
	require.Equal(t, int32(1), e.runs.Load(), "the handler ran once")

	// The same key as a quoted Structured Field string (IETF draft syntax) is the same key.
	quoted := e.post(`"k-1"`, `{"amount":2400}`)
	require.Equal(t, first.body, quoted.body)

	// A new key is a new payment.
	require.Equal(t, http.StatusCreated, e.post("k-2", `{"amount":2400}`).status)
	require.Equal(t, 2, e.payments())
	st := e.mw.Counters()
	require.Equal(t, uint64(2), st.Stored)
	require.Equal(t, uint64(4), st.Replayed)
}

func TestReplayIsByteForByte(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	payload := []byte{0x00, 0xff, 0xfe, '\r', '\n', ' ', 0x80, 'x', ' ', '\n'} // not text, trailing space
	e.hook = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write(payload[:4])
		_, _ = w.Write(payload[4:])
		w.Header().Set("X-Too-Late", "ignored, as net/http ignores it") // after WriteHeader
		return false
	}
	first := e.post("bin", `{"amount":1}`)
	again := e.post("bin", `{"amount":1}`)
	require.Equal(t, http.StatusAccepted, again.status)
	require.Equal(t, payload, first.body)
	require.Equal(t, payload, again.body)
	require.Equal(t, []string{"a", "b"}, again.header.Values("X-Multi"))
	require.Empty(t, first.header.Get("X-Too-Late"))
	require.Empty(t, again.header.Get("X-Too-Late"))
	require.Equal(t, first.header.Get("Content-Type"), again.header.Get("Content-Type"), "sniffed once, stored")
}

func TestConcurrentRequestsWithOneKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{RetryAfter: 2 * time.Second})
	entered := make(chan struct{})
	release := make(chan struct{})
	var calls atomic.Int32
	e.hook = func(http.ResponseWriter, *http.Request) bool {
		if calls.Add(1) == 1 {
			close(entered)
			<-release // hold the first request until the second has been answered
		}
		return true
	}
	firstDone := make(chan result)
	go func() { firstDone <- e.post("k-1", `{"amount":2400}`) }()
	testwait.Closed(t, entered, "the first request to reach the handler")

	second := e.post("k-1", `{"amount":2400}`)
	require.Equal(t, http.StatusConflict, second.status)
	require.Equal(t, httpidem.ProblemInProgress, problemType(t, second))
	require.Equal(t, "2", second.header.Get("Retry-After"))
	close(release)

	first := testwait.Receive(t, firstDone, "the first request's response")
	require.Equal(t, http.StatusCreated, first.status, "exactly one 2xx")
	require.Equal(t, int32(1), calls.Load(), "the second request never reached the handler")
	require.Equal(t, 1, e.payments())

	// After the first finished, the same retry is answered from the record.
	third := e.post("k-1", `{"amount":2400}`)
	require.Equal(t, http.StatusCreated, third.status)
	require.Equal(t, first.body, third.body)
	require.Equal(t, uint64(1), e.mw.Counters().Conflicts)
}

func TestSameKeyDifferentRequestIs422(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	require.Equal(t, http.StatusCreated, e.post("k-1", `{"amount":2400}`).status)

	changed := e.post("k-1", `{"amount":9999}`)
	require.Equal(t, http.StatusUnprocessableEntity, changed.status)
	require.Equal(t, httpidem.ProblemKeyReused, problemType(t, changed))

	otherPath := e.do(http.MethodPost, "/payments?currency=USD", "k-1", "client-a", `{"amount":2400}`)
	require.Equal(t, http.StatusUnprocessableEntity, otherPath.status, "the query is part of the request")
	require.Equal(t, 1, e.payments())
	require.Equal(t, uint64(2), e.mw.Counters().Mismatches)
}

func TestKeyRequiredAndValidated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	missing := e.post("", `{"amount":1}`)
	require.Equal(t, http.StatusBadRequest, missing.status)
	require.Equal(t, httpidem.ProblemMissingKey, problemType(t, missing))
	require.Contains(t, string(missing.body), "Idempotency-Key")

	for name, key := range map[string]string{
		"too long":        strings.Repeat("k", 256),
		"non-ASCII":       "ключ",
		"inner space":     "a b",
		"bad quoting":     `"abc`,
		"bad escape":      `"a\nb"`,
		"empty quoted":    `""`,
		"quote in middle": `"a"b"`,
	} {
		r := e.post(key, `{"amount":1}`)
		require.Equal(t, http.StatusBadRequest, r.status, name)
		require.Equal(t, httpidem.ProblemInvalidKey, problemType(t, r), name)
	}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/payments", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Authorization", "Bearer a")
	req.Header.Add("Idempotency-Key", "one")
	req.Header.Add("Idempotency-Key", "two")
	resp, err := e.srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "two keys are ambiguous")

	// 255 characters is fine.
	require.Equal(t, http.StatusCreated, e.post(strings.Repeat("k", 255), `{"amount":1}`).status)
	require.Equal(t, 1, e.payments(), "no refused request ran")

	// Methods outside Config.Methods pass through untouched, without a transaction.
	list := e.do(http.MethodGet, "/payments", "", "", "")
	require.Equal(t, http.StatusOK, list.status)
	require.Equal(t, "list (tx=false)", string(list.body))

	big := e.post("big", `{"amount":1,"pad":"`+strings.Repeat("x", 1<<20)+`"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, big.status)
}

func TestKeyOptionalRunsKeylessRequestsInATransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{AllowMissingKey: true})
	require.Equal(t, http.StatusCreated, e.post("", `{"amount":1}`).status)
	require.Equal(t, http.StatusCreated, e.post("", `{"amount":1}`).status)
	require.Equal(t, 2, e.payments(), "without a key every request runs")
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("http_idempotency_keys")))
	require.Equal(t, uint64(2), e.mw.Counters().Keyless)

	// A keyless 5xx is rolled back like a keyed one, and counted as not stored.
	e.hook = func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "ledger unavailable", http.StatusServiceUnavailable)
		return false
	}
	require.Equal(t, http.StatusServiceUnavailable, e.post("", `{"amount":1}`).status)
	require.Equal(t, 2, e.payments(), "the 5xx rolled back the handler's writes")
	require.Equal(t, uint64(1), e.mw.Counters().NotStored)
}

func TestKeysAreScopedPerClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	a := e.do(http.MethodPost, "/payments", "shared-key", "client-a", `{"amount":1}`)
	b := e.do(http.MethodPost, "/payments", "shared-key", "client-b", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, http.StatusCreated, b.status)
	require.NotEqual(t, a.body, b.body, "client b did not get client a's response")
	require.Equal(t, 2, e.payments())
	require.Equal(t, a.body, e.do(http.MethodPost, "/payments", "shared-key", "client-a", `{"amount":1}`).body)
	require.Equal(t, b.body, e.do(http.MethodPost, "/payments", "shared-key", "client-b", `{"amount":1}`).body)

	// The stored scope is a hash, not the credential.
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("http_idempotency_keys")+` WHERE scope LIKE '%client-a%'`))

	anonymous := e.do(http.MethodPost, "/payments", "k", "", `{"amount":1}`)
	require.Equal(t, http.StatusBadRequest, anonymous.status)
	require.Equal(t, httpidem.ProblemNoScope, problemType(t, anonymous))
}

func TestServerErrorsAreNotStoredByDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	var fail atomic.Bool
	fail.Store(true)
	e.hook = func(w http.ResponseWriter, r *http.Request) bool {
		if fail.Load() {
			http.Error(w, "ledger unavailable", http.StatusServiceUnavailable)
			return false
		}
		return true
	}
	r := e.post("k-1", `{"amount":1}`)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, "ledger unavailable\n", string(r.body), "the client still gets the handler's response")
	require.Zero(t, e.payments(), "the 5xx rolled back the handler's writes")

	fail.Store(false)
	r = e.post("k-1", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, r.status, "the key stayed free: the retry ran")
	require.Equal(t, 1, e.payments())
	require.Equal(t, uint64(1), e.mw.Counters().NotStored)

	// With StoreServerErrors the 5xx is stored with its effects and replayed, as Stripe does.
	s := newEnv(t, httpidem.Config{StoreServerErrors: true})
	s.hook = func(w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "partial failure", http.StatusInternalServerError)
		return false
	}
	first := s.post("k-1", `{"amount":1}`)
	again := s.post("k-1", `{"amount":1}`)
	require.Equal(t, http.StatusInternalServerError, again.status)
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get(httpidem.ReplayedHeader))
	require.Equal(t, int32(1), s.runs.Load())
	require.Equal(t, 1, s.payments())
}

// TestResponseCommitsWithEffectsAndOutbox: the stored response, the handler's rows and its
// outbox message commit together; a failed commit leaves none of them and the retry runs.
func TestResponseCommitsWithEffectsAndOutbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	w, err := outbox.NewWriter(outbox.Config{Schema: e.schema})
	require.NoError(t, err)
	// A deferred constraint that fails at COMMIT while the gate row has no parent.
	pgtest.Exec(t, e.db, `CREATE TABLE `+e.table("gate_parent")+` (id int PRIMARY KEY)`)
	pgtest.Exec(t, e.db, `CREATE TABLE `+e.table("gate")+` (parent int REFERENCES `+e.table("gate_parent")+` DEFERRABLE INITIALLY DEFERRED)`)
	e.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		tx, _ := pgtx.TxFromContext(r.Context())
		if err := w.PublishTx(r.Context(), tx, "payments", message.NewMessage(watermill.NewUUID(), []byte(`{"event":"PaymentCreated"}`))); err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return false
		}
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO `+e.table("gate")+` VALUES (1)`); err != nil {
			http.Error(rw, err.Error(), http.StatusInternalServerError)
			return false
		}
		return true
	}
	outboxRows := func() int { return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("outbox")) }
	keys := func() int { return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("http_idempotency_keys")) }

	failed := e.post("k-1", `{"amount":1}`)
	require.Equal(t, http.StatusInternalServerError, failed.status, "the handler said 201, but the commit failed: the client must not see 201")
	require.Equal(t, httpidem.ProblemNotStored, problemType(t, failed))
	require.Zero(t, e.payments())
	require.Zero(t, outboxRows())
	require.Zero(t, keys())

	pgtest.Exec(t, e.db, `INSERT INTO `+e.table("gate_parent")+` VALUES (1)`)
	ok := e.post("k-1", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, ok.status)
	require.Equal(t, 1, e.payments())
	require.Equal(t, 1, outboxRows())
	require.Equal(t, 1, keys())
	require.Equal(t, ok.body, e.post("k-1", `{"amount":1}`).body)
	require.Equal(t, 1, outboxRows(), "the replay emitted nothing")
}

func TestKeysExpire(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	first := e.post("k-1", `{"amount":1}`)
	require.Equal(t, first.body, e.post("k-1", `{"amount":1}`).body)
	e.post("k-2", `{"amount":1}`)

	// A day passes for k-1.
	pgtest.Exec(t, e.db, `UPDATE `+e.table("http_idempotency_keys")+` SET created_at = now() - interval '24 hours 1 second' WHERE idem_key = 'k-1'`)
	after := e.post("k-1", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, after.status)
	require.NotEqual(t, first.body, after.body, "an expired key runs as a new request")
	require.Empty(t, after.header.Get(httpidem.ReplayedHeader))
	require.Equal(t, 3, e.payments())

	pgtest.Exec(t, e.db, `UPDATE `+e.table("http_idempotency_keys")+` SET created_at = now() - interval '25 hours' WHERE idem_key = 'k-2'`)
	n, err := e.mw.Prune(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("http_idempotency_keys")))
}

func TestPanicReleasesTheKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	var panicked atomic.Bool
	e.hook = func(http.ResponseWriter, *http.Request) bool {
		if !panicked.Swap(true) {
			panic(http.ErrAbortHandler) // net/http closes the connection without logging
		}
		return true
	}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/payments", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Idempotency-Key", "k-1")
	req.Header.Set("Authorization", "Bearer a")
	resp, err := e.srv.Client().Do(req)
	if resp != nil {
		_ = resp.Body.Close()
	}
	require.Error(t, err, "the connection was aborted")
	require.Zero(t, e.payments())
	require.Equal(t, http.StatusCreated, e.do(http.MethodPost, "/payments", "k-1", "a", `{"amount":1}`).status, "not locked, not stored: the retry runs")
}

func TestResponseTooLargeIsNotStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{MaxResponseBytes: 16})
	e.hook = func(w http.ResponseWriter, r *http.Request) bool {
		_, err := w.Write(bytes.Repeat([]byte("x"), 17))
		require.Error(t, err, "the handler learns at once that the response cannot be kept")
		return false
	}
	r := e.post("k-1", `{"amount":1}`)
	require.Equal(t, http.StatusInternalServerError, r.status)
	require.Zero(t, e.payments())
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	for name, cfg := range map[string]httpidem.Config{
		"schema":     {Schema: "x;drop"},
		"header":     {Header: "Idem Key"},
		"methods":    {Methods: []string{}},
		"method":     {Methods: []string{"post"}},
		"retention":  {Retention: time.Millisecond},
		"key length": {MaxKeyLength: 5000},
		"fp header":  {FingerprintHeaders: []string{"bad header"}},
		"read-only":  {TxOptions: &sql.TxOptions{ReadOnly: true}},
		"isolation":  {TxOptions: &sql.TxOptions{Isolation: sql.LevelLinearizable}},
	} {
		_, err := httpidem.NewMiddleware(db, cfg, nil)
		require.ErrorContains(t, err, "invalid config", name)
	}
	_, err := httpidem.NewMiddleware(nil, httpidem.Config{}, nil)
	require.ErrorContains(t, err, "db is nil")

	// A missing table is reported as such.
	mw, err := httpidem.NewMiddleware(db, httpidem.Config{Schema: pgtest.NewName("none")}, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(mw.Handler(http.NotFoundHandler()))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("Authorization", "a")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
}

// TestEmptyBodiesAreStoredAndReplayed: a response without a body (204, an empty 202, an
// implicit 200, an empty 5xx under StoreServerErrors) is stored as an empty body, commits with
// its effects and is replayed empty with the same status and headers.
func TestEmptyBodiesAreStoredAndReplayed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		status int // 0: the handler writes nothing at all (implicit 200)
		store5 bool
	}{
		{"204", http.StatusNoContent, false},
		{"empty 202", http.StatusAccepted, false},
		{"implicit 200", 0, false},
		{"empty 500 stored", http.StatusInternalServerError, true},
		{"empty 503 stored", http.StatusServiceUnavailable, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, httpidem.Config{StoreServerErrors: c.store5})
			e.hook = func(w http.ResponseWriter, r *http.Request) bool {
				w.Header().Set("X-Payment", "p-1")
				if c.status != 0 {
					w.WriteHeader(c.status)
				}
				return false
			}
			want := c.status
			if want == 0 {
				want = http.StatusOK
			}
			first := e.post("empty", `{"amount":1}`)
			require.Equal(t, want, first.status, string(first.body))
			require.Empty(t, first.body)
			require.Equal(t, "p-1", first.header.Get("X-Payment"))
			require.Equal(t, 1, e.payments(), "the handler's write committed")

			again := e.post("empty", `{"amount":1}`)
			require.Equal(t, want, again.status, string(again.body))
			require.Empty(t, again.body)
			require.Equal(t, "p-1", again.header.Get("X-Payment"))
			require.Equal(t, first.header.Get("Content-Type"), again.header.Get("Content-Type"))
			require.Equal(t, "true", again.header.Get(httpidem.ReplayedHeader))
			require.Equal(t, 1, e.payments())
			require.Equal(t, int32(1), e.runs.Load(), "the handler ran once")
			st := e.mw.Counters()
			require.Equal(t, uint64(1), st.Stored)
			require.Equal(t, uint64(1), st.Replayed)
			require.Zero(t, st.Failed)
		})
	}
}

// TestHeadersThatAreNotTextReplayExactly: header values that are not valid UTF-8 (obs-text
// such as a Latin-1 file name) or hold a NUL byte are stored and replayed byte for byte; jsonb
// alone would alter the first and refuse the second.
func TestHeadersThatAreNotTextReplayExactly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, httpidem.Config{})
	e.hook = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Disposition", "attachment; filename=\"caf\xe9.pdf\"")
		if r.URL.Query().Get("nul") != "" {
			w.Header().Set("X-Nul", "a\x00b")
		}
		w.Header()["bad name"] = []string{"net/http drops it"}
		w.WriteHeader(http.StatusCreated)
		return false
	}
	first := e.post("latin1", `{"amount":1}`)
	again := e.post("latin1", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, first.status, string(first.body))
	require.Equal(t, http.StatusCreated, again.status, string(again.body))
	require.Equal(t, "true", again.header.Get(httpidem.ReplayedHeader))
	require.Equal(t, []string{"attachment; filename=\"caf\xe9.pdf\""}, first.header.Values("Content-Disposition"))
	require.Equal(t, first.header.Values("Content-Disposition"), again.header.Values("Content-Disposition"))

	// A NUL byte breaks the response on the wire, so this part calls the handler directly.
	call := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments?nul=1", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", "nul")
		req.Header.Set("Authorization", "Bearer client-a")
		rec := httptest.NewRecorder()
		e.srv.Config.Handler.ServeHTTP(rec, req)
		return rec
	}
	r1, r2 := call(), call()
	require.Equal(t, http.StatusCreated, r1.Code, r1.Body.String())
	require.Equal(t, http.StatusCreated, r2.Code, r2.Body.String())
	require.Equal(t, []string{"a\x00b"}, r2.Header().Values("X-Nul"))
	require.Equal(t, "true", r2.Header().Get(httpidem.ReplayedHeader))
	require.Equal(t, 2, e.payments())
	require.Equal(t, int32(2), e.runs.Load())
}
