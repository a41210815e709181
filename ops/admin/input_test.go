package admin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/pgtx"
)

// errorLog records the errors the handler logs: bad input must be answered 400, never be
// logged as a server failure.
type errorLog struct {
	watermill.NopLogger
	mu   sync.Mutex
	msgs []string
	info []string
}

func (l *errorLog) Error(msg string, err error, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, msg+": "+err.Error())
}

func (l *errorLog) Info(msg string, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.info = append(l.info, msg)
}

// infos counts the info messages that start with prefix.
func (l *errorLog) infos(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.info {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

func (l *errorLog) logged() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// TestBadTextIs400: text PostgreSQL cannot hold (NUL, invalid UTF-8) and over-long consumer
// names are refused with 400 and a reason by every endpoint that takes them, before any query.
func TestBadTextIs400(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	log := &errorLog{}
	h, err := admin.NewHandler(db, admin.Config{Schema: schema, AllowWrites: true}, log)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	api := srv.URL + "/api/"
	long := strings.Repeat("c", 256)

	q := func(kv ...string) string {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v.Encode()
	}
	for _, tc := range []struct {
		path string
		want string
	}{
		{"inbox?" + q("consumer", "bill\x00ing"), "consumer must not contain NUL"},
		{"inbox?" + q("consumer", "bill\xffing"), "consumer must be valid UTF-8"},
		{"inbox?" + q("consumer", long), "consumer is 256 bytes long; the limit is 255"},
		{"inbox?" + q("consumer", "billing", "key", "k\x00"), "key must not contain NUL"},
		{"inbox?" + q("consumer", "billing", "key", "k\xc3"), "key must be valid UTF-8"},
		{"inbox?" + q("consumer", "billing", "message", "m\x00"), "message must not contain NUL"},
		{"inbox?" + q("consumer", "billing", "message", "\xff"), "message must be valid UTF-8"},
		{"inbox?" + q("consumer", "billing", "topic", "t\x00"), "topic must not contain NUL"},
		{"inbox?" + q("consumer", "billing", "topic", "\xfe"), "topic must be valid UTF-8"},
		{"inbox?" + q("consumer", "billing", "error", "e\x00"), "error must not contain NUL"},
		{"inbox?" + q("consumer", "billing", "error", "\xff\xfe"), "error must be valid UTF-8"},
		{"inbox?" + q("consumer", "billing", "status", "FAILED\x00"), "status must not contain NUL"},
		{"dedupe?" + q("consumer", "r\x00", "message", "m"), "consumer must not contain NUL"},
		{"dedupe?" + q("consumer", long, "message", "m"), "consumer is 256 bytes long"},
		{"dedupe?" + q("consumer", "rewards", "message", "m\x00"), "message must not contain NUL"},
		{"dedupe?" + q("consumer", "rewards", "message", "\xff"), "message must be valid UTF-8"},
		{"inbox?" + q("consumer", "billing", "received_after", "2026\x00"), "received_after must not contain NUL"},
		{"inbox?" + q("consumer", "billing", "received_before", "\xff"), "received_before must be valid UTF-8"},
		{"history?" + q("consumer", "r\x00"), "consumer must not contain NUL"},
		{"history?" + q("consumer", "\xff"), "consumer must be valid UTF-8"},
		{"history?" + q("consumer", long), "consumer is 256 bytes long"},
		{"history?" + q("relay", "s\x00"), "relay must not contain NUL"},
		{"history?" + q("window", "h\x00"), "window must not contain NUL"},
		{"outbox/rejected?" + q("relay", "s\x00"), "relay must not contain NUL"},
		{"outbox/rejected?" + q("relay", "\xc3"), "relay must be valid UTF-8"},
		{"outbox/rejected?" + q("rejected_after", "\xff"), "rejected_after must be valid UTF-8"},
		{"outbox/rejected/1?" + q("relay", "s\x00"), "relay must not contain NUL"},
	} {
		r := get(t, api+tc.path)
		require.Equal(t, http.StatusBadRequest, r.status, "%q: %s", tc.path, r.body)
		require.Contains(t, r.errorText(t), tc.want, "%q", tc.path)
	}

	for _, tc := range []struct {
		action string
		body   operate.ChangeRequest
		want   string
	}{
		{"replay", operate.ChangeRequest{Consumer: "b\x00"}, "consumer must not contain NUL"},
		{"replay", operate.ChangeRequest{Consumer: long}, "consumer is 256 bytes long"},
		{"replay", operate.ChangeRequest{Consumer: "billing", MessageIDs: []string{"ok", "m\x00"}}, "message_ids must not contain NUL"},
		{"replay", operate.ChangeRequest{Consumer: "billing", OrderingKey: "k\x00"}, "ordering_key must not contain NUL"},
		{"replay", operate.ChangeRequest{Consumer: "billing", Topic: "t\x00"}, "topic must not contain NUL"},
		{"replay", operate.ChangeRequest{Consumer: "billing", ErrorContains: "e\x00"}, "error_contains must not contain NUL"},
		{"skip", operate.ChangeRequest{Consumer: "billing", All: true, Reason: "r\x00"}, "reason must not contain NUL"},
		{"skip", operate.ChangeRequest{Consumer: "b\x00", All: true, Reason: "r"}, "consumer must not contain NUL"},
	} {
		r := post(t, api+"inbox/"+tc.action, tc.body, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s %+v: %s", tc.action, tc.body, r.body)
		require.Contains(t, r.errorText(t), tc.want, "%s %+v", tc.action, tc.body)
	}
	require.Empty(t, log.logged(), "bad input is not a server error")
}

// TestMissingTablesAre503: on a schema without tables, every endpoint that reads a table
// answers 503 saying which migration command to run; /api/status answers 200 with version 0
// and the same hint, since reporting that is its job. The background sampler, which fails the
// same way, says so once at info level, not as an error.
func TestMissingTablesAre503(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	empty := pgtest.NewName("none")
	log := &errorLog{}
	h, err := admin.NewHandler(db, admin.Config{Schema: empty, AllowWrites: true, SampleInterval: -1}, log)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	api := srv.URL + "/api/"
	fix := "wmonce -schema " + empty + " migrate up"

	var st operate.StatusResponse
	r := get(t, api+"status")
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &st)
	require.Zero(t, st.Version)
	require.Contains(t, st.Hint, fix)

	for _, path := range []string{"consumers", "inbox/stats", "inbox?consumer=billing", "inbox/1", "outbox", "dedupe?consumer=rewards&message=m-1",
		"history", "history?window=day&consumer=rewards", "outbox/rejected", "outbox/rejected/1"} {
		r := get(t, api+path)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s: %s", path, r.body)
		require.Contains(t, r.errorText(t), fix, path)
	}
	for _, tc := range []struct {
		action string
		body   operate.ChangeRequest
	}{
		{"replay", operate.ChangeRequest{Consumer: "billing"}},
		{"replay", operate.ChangeRequest{Consumer: "billing", DryRun: true}},
		{"skip", operate.ChangeRequest{Consumer: "billing", All: true, Reason: "r"}},
	} {
		r := post(t, api+"inbox/"+tc.action, tc.body, nil)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s: %s", tc.action, r.body)
		require.Contains(t, r.errorText(t), fix, tc.action)
	}
	// Samples fail the same way: the sampler says so once.
	for range 3 {
		admin.SampleAndLog(context.Background(), h)
	}
	require.Empty(t, log.logged(), "a missing table is the operator's to fix, not a server error")
	require.Equal(t, 1, log.infos("Admin history sample"), "said once")
}

// A schema built from an earlier release's printed SQL (migrations 1-10, no version rows) lacks
// the later tables, and migrate up refuses it until its versions are recorded: /api/status and
// the 503 of an endpoint that reads a later table say to record them, never "migrate up" alone.
func TestUnrecordedSchemaAdvisesBaseline(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.NewName("unrec")
	t.Cleanup(func() { pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(schema)+` CASCADE`) })
	printed, err := migrate.Print(schema, migrate.DirectionUp, 0, 10)
	require.NoError(t, err)
	pgtest.Exec(t, db, printed+`; DROP TABLE `+pgtx.QualifiedName(schema, "schema_migrations"))
	h, err := admin.NewHandler(db, admin.Config{Schema: schema, SampleInterval: -1}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	fix := "wmonce -schema " + schema + " migrate baseline N"

	var st operate.StatusResponse
	r := get(t, srv.URL+"/api/status")
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &st)
	require.True(t, st.Unrecorded)
	require.Contains(t, st.Hint, fix)
	r = get(t, srv.URL+"/api/history?window=day&consumer=rewards") // duplicates_per_minute: migration 015
	require.Equal(t, http.StatusServiceUnavailable, r.status, string(r.body))
	require.Contains(t, r.errorText(t), fix)
}
