package admin_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/ops/admin"
)

func TestNewHandlerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	_, err := admin.NewHandler(nil, admin.Config{}, nil)
	require.ErrorContains(t, err, "db is nil")
	_, err = admin.NewHandler(pgtest.DB(t), admin.Config{Schema: "Ops; DROP"}, nil)
	require.ErrorContains(t, err, `schema name "Ops; DROP" is not allowed`)
	_, err = admin.NewHandler(pgtest.DB(t), admin.Config{QueryTimeout: -time.Second}, nil)
	require.ErrorContains(t, err, "QueryTimeout must not be negative")
	_, err = admin.NewHandler(pgtest.DB(t), admin.Config{SampleInterval: time.Millisecond}, nil)
	require.ErrorContains(t, err, "SampleInterval must be at least 1s (or negative to turn sampling off), got 1ms")
}

func TestReadAPI(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 2)
	srv := f.Server(t, admin.Config{Middlewares: []*once.Middleware{f.MW}})
	api := srv.URL + "/api/"

	var st operate.StatusResponse
	get(t, api+"status").decode(t, &st)
	require.Equal(t, f.Schema, st.Schema)
	require.Equal(t, migrate.Latest(), st.Version)
	require.Empty(t, st.Hint)
	require.False(t, st.WritesAllowed)

	var cs operate.ConsumersResponse
	get(t, api+"consumers").decode(t, &cs)
	require.True(t, cs.InProcessCounters)
	require.Len(t, cs.Consumers, 1)
	c := cs.Consumers[0]
	require.Equal(t, "rewards", c.Consumer)
	require.Equal(t, int64(3), c.Claims)
	require.NotNil(t, c.NewestClaim)
	require.WithinDuration(t, time.Now(), *c.NewestClaim, time.Minute)
	require.Equal(t, operate.Counters{Fresh: 3, Duplicates: 1}, *c.Counters)
	require.InDelta(t, 0.25, *c.DuplicateRate, 1e-9)

	var is operate.InboxStatsResponse
	get(t, api+"inbox/stats").decode(t, &is)
	require.Len(t, is.Consumers, 1)
	require.Equal(t, "billing", is.Consumers[0].Consumer)
	require.Equal(t, int64(2), is.Consumers[0].Failed)
	require.Equal(t, int64(1), is.Consumers[0].Done)
	require.Zero(t, is.Consumers[0].Pending)

	var list operate.InboxListResponse
	get(t, api+"inbox?consumer=billing&status=failed").decode(t, &list)
	require.Len(t, list.Rows, 2)
	require.Equal(t, "inv-1", list.Rows[0].MessageID)
	require.Equal(t, "FAILED", list.Rows[0].Status)
	require.Equal(t, "card declined: <b>insufficient funds</b>", list.Rows[0].LastError)
	require.Nil(t, list.Rows[0].Payload, "lists leave payloads out")
	require.Zero(t, list.NextAfter)
	get(t, api+"inbox?consumer=billing&limit=1").decode(t, &list)
	require.Len(t, list.Rows, 1)
	require.Equal(t, list.Rows[0].ID, list.NextAfter)
	get(t, fmt.Sprintf("%sinbox?consumer=billing&limit=5&after=%d", api, list.NextAfter)).decode(t, &list)
	require.Equal(t, []string{"inv-2", "inv-3"}, []string{list.Rows[0].MessageID, list.Rows[1].MessageID})

	var row operate.InboxRow
	get(t, fmt.Sprintf("%sinbox/%d", api, list.Rows[0].ID)).decode(t, &row)
	require.Equal(t, `{"invoice":2,"note":"<img src=x onerror=alert(1)>"}`, *row.Payload)
	require.Equal(t, map[string]string{"fail": "1"}, row.Metadata)

	var ob operate.OutboxStats
	get(t, api+"outbox").decode(t, &ob)
	require.Len(t, ob.Relays, 1)
	require.Equal(t, "sms", ob.Relays[0].Name)
	require.Equal(t, int64(1), ob.Relays[0].Backlog)
	require.Equal(t, int64(1), ob.Rejected, "the fixture's legacy-7")

	var p operate.Processed
	get(t, api+"dedupe?consumer=rewards&message=m-2").decode(t, &p)
	require.True(t, p.Processed)
	require.NotNil(t, p.Claim)
	get(t, api+"dedupe?consumer=rewards&message=m-9").decode(t, &p)
	require.False(t, p.Processed)

	// Bad input: 400 with a message saying what to fix; missing things: 404; wrong verbs: 405.
	for _, tc := range []struct {
		path   string
		status int
		want   string
	}{
		{"inbox", 400, "consumer parameter is required"},
		{"inbox?consumer=billing&status=LOST", 400, `unknown inbox status "LOST"`},
		{"inbox?consumer=billing&limit=0", 400, "limit must be an integer between 1 and 1000"},
		{"inbox?consumer=billing&after=-3", 400, "after must be a row id"},
		{"inbox/abc", 400, "inbox row id must be a positive integer"},
		{"inbox/999999", 404, "row not found"},
		{"dedupe?consumer=rewards", 400, "both consumer and message are required"},
		{"nope", 404, "no such endpoint"},
	} {
		r := get(t, api+tc.path)
		require.Equal(t, tc.status, r.status, tc.path)
		require.Contains(t, r.header.Get("Content-Type"), "application/json", tc.path)
		require.Contains(t, r.errorText(t), tc.want, tc.path)
	}
	r := post(t, api+"consumers", map[string]any{}, nil)
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
}

func TestWritesAreRefusedWhenReadOnly(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 2)
	srv := f.Server(t, admin.Config{})
	for _, path := range []string{"replay", "skip"} {
		r := post(t, srv.URL+"/api/inbox/"+path, operate.ChangeRequest{Consumer: "billing", Reason: "x", All: true}, nil)
		require.Equal(t, http.StatusForbidden, r.status)
		require.Contains(t, r.errorText(t), "read-only: set admin.Config.AllowWrites")
	}
	require.Equal(t, 2, f.Count(t, "FAILED"))
}

func TestWritesNeedPostJSONAndTheHeader(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 1)
	srv := f.Server(t, admin.Config{AllowWrites: true})
	url := srv.URL + "/api/inbox/replay"
	body := operate.ChangeRequest{Consumer: "billing"}

	r := post(t, url, body, map[string]string{admin.WriteHeader: ""})
	require.Equal(t, http.StatusForbidden, r.status)
	require.Contains(t, r.errorText(t), "X-Wmonce-Admin: 1")
	// What a cross-site HTML form can send.
	r = post(t, url, "consumer=billing", map[string]string{admin.WriteHeader: "", "Content-Type": "application/x-www-form-urlencoded"})
	require.Equal(t, http.StatusForbidden, r.status)
	r = post(t, url, `{"consumer":"billing"}`, map[string]string{"Content-Type": "text/plain"})
	require.Equal(t, http.StatusUnsupportedMediaType, r.status)
	r = post(t, url, body, map[string]string{"Sec-Fetch-Site": "cross-site"})
	require.Equal(t, http.StatusForbidden, r.status)
	r = get(t, url)
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, 1, f.Count(t, "FAILED"), "nothing changed")
}

func TestReplayAndSkip(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 4)
	srv := f.Server(t, admin.Config{AllowWrites: true})
	replay, skip := srv.URL+"/api/inbox/replay", srv.URL+"/api/inbox/skip"
	failed := f.IDs(t, "FAILED")
	require.Len(t, failed, 4)

	// Dry run: counts, changes nothing.
	var ch operate.ChangeResponse
	r := post(t, replay, operate.ChangeRequest{Consumer: "billing", DryRun: true}, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &ch)
	require.Equal(t, operate.ChangeResponse{Action: "replay", Consumer: "billing", DryRun: true, Rows: 4}, ch)
	require.Equal(t, 4, f.Count(t, "FAILED"))

	// Replay one row by id.
	post(t, replay, operate.ChangeRequest{Consumer: "billing", IDs: []int64{failed[0]}}, nil).decode(t, &ch)
	require.Equal(t, 1, ch.Rows)
	require.Equal(t, "PENDING", f.RowStatus(t, failed[0]))

	// Skip one row with a reason.
	post(t, skip, operate.ChangeRequest{Consumer: "billing", IDs: []int64{failed[1]}, Reason: "refunded by hand"}, nil).decode(t, &ch)
	require.Equal(t, operate.ChangeResponse{Action: "skip", Consumer: "billing", Rows: 1}, ch)
	require.Equal(t, "SKIPPED", f.RowStatus(t, failed[1]))
	require.Equal(t, 1, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("inbox")+` WHERE id = $1 AND last_error LIKE 'skipped: refunded by hand%'`, failed[1]))

	// Bad requests change nothing and say why.
	for _, tc := range []struct {
		url  string
		body any
		want string
	}{
		{replay, `{"consumer":`, "cannot read the JSON body"},
		{replay, `{"consumer":"billing","dryrun":true}`, `unknown field "dryrun"`},
		{replay, operate.ChangeRequest{}, "consumer is required"},
		{replay, operate.ChangeRequest{Consumer: "billing", Statuses: []string{"IN_PROGRESS"}}, "belong to a worker"},
		{replay, operate.ChangeRequest{Consumer: "billing", Statuses: []string{"DONE", "LATE"}}, `unknown inbox status "LATE"`},
		{replay, operate.ChangeRequest{Consumer: "billing", IDs: []int64{0}}, "ids must be positive"},
		{replay, operate.ChangeRequest{Consumer: "billing", Reason: "x"}, "reason and all belong to skip"},
		{skip, operate.ChangeRequest{Consumer: "billing", IDs: []int64{failed[2]}}, "reason is required"},
		{skip, operate.ChangeRequest{Consumer: "billing", Reason: "x"}, "or set all to skip every matching row"},
		{skip, operate.ChangeRequest{Consumer: "billing", Reason: "x", All: true, Statuses: []string{"DONE"}}, "status DONE cannot be changed by skip (allowed: FAILED, PENDING)"},
	} {
		r := post(t, tc.url, tc.body, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%v: %s", tc.body, r.body)
		require.Contains(t, r.errorText(t), tc.want, "%v", tc.body)
	}
	require.Equal(t, 2, f.Count(t, "FAILED"))

	// Replay the rest of the FAILED rows at once.
	post(t, replay, operate.ChangeRequest{Consumer: "billing", Statuses: []string{"FAILED"}}, nil).decode(t, &ch)
	require.Equal(t, 2, ch.Rows)
	require.Equal(t, 0, f.Count(t, "FAILED"))
	require.Equal(t, 3, f.Count(t, "PENDING"))
}

func TestMountedUnderAPrefix(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	h, err := admin.NewHandler(db, admin.Config{Schema: schema}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	mux := http.NewServeMux()
	mux.Handle("/ops/wmonce/", http.StripPrefix("/ops/wmonce", h))
	mux.Handle("/ops/wmonce", http.StripPrefix("/ops/wmonce", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.Get(srv.URL + "/ops/wmonce?x=1")
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusMovedPermanently, res.StatusCode)
	require.Equal(t, "/ops/wmonce/", res.Header.Get("Location"))

	page := get(t, srv.URL+"/ops/wmonce/")
	require.Equal(t, http.StatusOK, page.status)
	require.Contains(t, string(page.body), `<script src="app.js" defer></script>`, "relative links follow the prefix")
	require.Contains(t, page.header.Get("Content-Security-Policy"), "script-src 'self'")
	require.Equal(t, "DENY", page.header.Get("X-Frame-Options"))
	for _, asset := range []string{"app.js", "style.css"} {
		r := get(t, srv.URL+"/ops/wmonce/"+asset)
		require.Equal(t, http.StatusOK, r.status, asset)
		require.NotEmpty(t, r.body)
	}
	js := get(t, srv.URL+"/ops/wmonce/app.js")
	require.NotContains(t, string(js.body), "innerHTML", "the page inserts API data as text only")

	var st operate.StatusResponse
	get(t, srv.URL+"/ops/wmonce/api/status").decode(t, &st)
	require.Equal(t, schema, st.Schema)

	// A schema without tables: the API says what to run.
	empty := pgtest.NewName("none")
	h2, err := admin.NewHandler(db, admin.Config{Schema: empty, SampleInterval: -1}, nil)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	h2.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/outbox", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.True(t, strings.Contains(rec.Body.String(), "wmonce -schema "+empty+" migrate up"), rec.Body.String())
}

// TestUnsetTimesAreNull: a time that is not set is null in the JSON, and its field is there,
// in every answer: no endpoint sends "0001-01-01T00:00:00Z" (a relay with no backlog had it
// as oldest_pending). Here the relay has caught up, billing has nothing PENDING, consumer
// audit has only in-process counts (no claim), no sample was taken, the FAILED row has no
// lease and rewards' claims have no day partition.
func TestUnsetTimesAreNull(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 1)
	f.RelayAll(t)
	audit, err := once.New(f.DB, once.Config{Schema: f.Schema, Consumer: "audit"}, nil)
	require.NoError(t, err)
	_, err = audit.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, errors.New("audit log unavailable")
	})(message.NewMessage("a-1", []byte(`{}`)))
	require.Error(t, err)
	srv := f.Server(t, admin.Config{Middlewares: []*once.Middleware{f.MW, audit}, SampleInterval: -1})
	api := srv.URL + "/api/"
	failed := f.IDs(t, "FAILED")[0]

	bodies := map[string][]byte{}
	for _, path := range []string{"outbox", "status", "consumers", "inbox/stats", "inbox?consumer=billing", fmt.Sprintf("inbox/%d", failed),
		"outbox/rejected", "history", "history?window=day", "dedupe?consumer=rewards&message=m-1", "dedupe?consumer=billing&message=inv-1"} {
		r := get(t, api+path)
		require.Equal(t, http.StatusOK, r.status, "%s: %s", path, r.body)
		require.NotContains(t, string(r.body), "0001-01-01", path)
		bodies[path] = r.body
	}
	for _, tc := range []struct {
		path  string
		field []any
	}{
		{"outbox", []any{"relays", 0, "oldest_pending"}},
		{"inbox/stats", []any{"consumers", 0, "oldest_pending_received_at"}},
		{"consumers", []any{"consumers", 0, "newest_claim"}}, // audit
		{"history", []any{"sampling", "since"}},
		{fmt.Sprintf("inbox/%d", failed), []any{"lease_until"}},
		{"inbox?consumer=billing", []any{"rows", 0, "lease_until"}},
		{"dedupe?consumer=rewards&message=m-1", []any{"claim", "occurred_on"}},
		{"dedupe?consumer=billing&message=inv-1", []any{"inbox", "lease_until"}},
	} {
		v, present := jsonAt(t, bodies[tc.path], tc.field...)
		require.True(t, present, "%s %v is in the answer", tc.path, tc.field)
		require.Nil(t, v, "%s %v", tc.path, tc.field)
	}
	// Set times are strings as before.
	v, _ := jsonAt(t, bodies["consumers"], "consumers", 1, "newest_claim") // rewards
	require.IsType(t, "", v)
	var cs operate.ConsumersResponse
	require.NoError(t, json.Unmarshal(bodies["consumers"], &cs))
	require.Equal(t, "audit", cs.Consumers[0].Consumer)
	require.Nil(t, cs.Consumers[0].NewestClaim)
	require.NotNil(t, cs.Consumers[1].NewestClaim)
}
