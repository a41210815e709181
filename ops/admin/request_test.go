package admin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/admin"
)

// writeEndpoints are the POST endpoints, each with a body it would act on, where %s is a JSON
// string literal sent as it is. Every write endpoint belongs here.
var writeEndpoints = []struct{ path, body string }{
	{"inbox/replay", `{"consumer":%s}`},
	{"inbox/replay", `{"consumer":"billing","ordering_key":%s}`},
	{"inbox/replay", `{"consumer":"billing","message_ids":["inv-1",%s]}`},
	{"inbox/skip", `{"consumer":"billing","all":true,"reason":%s}`},
	{"inbox/skip", `{"consumer":%s,"all":true,"reason":"refunded"}`},
	{"inbox/skip", `{"consumer":"billing","error_contains":%s,"reason":"refunded"}`},
	{"outbox/republish", `{"relay":%s,"all":true,"dry_run":true}`},
	{"outbox/republish", `{"relay":"relay","all":true,"remove_metadata":[%s],"dry_run":true}`},
	{"outbox/forget", `{"relay":%s,"dry_run":true}`},
}

// badJSONStrings are JSON string literals that encoding/json would decode to other text than
// was sent (U+FFFD for each bad part), with what the answer must say.
var badJSONStrings = []struct{ literal, want string }{
	{"\"bad \xff reason\"", "the JSON body is not valid UTF-8 (byte 0xff at offset"},
	{"\"adm\xff\"", "not valid UTF-8"},
	{"\"\xc3\"", "not valid UTF-8"},                   // a cut two-byte character
	{"\"\xc0\xaf\"", "not valid UTF-8"},               // an overlong "/"
	{"\"\xed\xa0\x80\"", "not valid UTF-8"},           // a surrogate encoded as UTF-8 (CESU-8)
	{`"bad \ud800 reason"`, `holds \ud800 at offset`}, // a high surrogate alone
	{`"\udfff"`, `holds \udfff at offset`},            // a low surrogate alone
	{`"\uDBFF"`, `holds \uDBFF at offset`},            // upper-case hex
	{`"\ud800\u0041"`, `holds \ud800`},                // a high surrogate, then no low one
	{`"\ud800\ud800"`, `holds \ud800`},                // two high ones
	{`"\ud800\\udc00"`, `holds \ud800`},               // then a backslash and text, not an escape
	{`"\\\udc00"`, `holds \udc00`},                    // an escaped backslash, then a lone low one
}

// inboxSnapshot is every inbox row's status, attempts and last error: what a write changes.
func inboxSnapshot(t *testing.T, f *admintest.Fixture) string {
	t.Helper()
	rows, err := f.DB.Query(`SELECT id, status, attempts, coalesce(last_error, '') FROM ` + f.Table("inbox") + ` ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id int64
		var status, lastError string
		var attempts int
		require.NoError(t, rows.Scan(&id, &status, &attempts, &lastError))
		fmt.Fprintf(&b, "%d %s %d %q\n", id, status, attempts, lastError)
	}
	require.NoError(t, rows.Err())
	return b.String()
}

// TestWriteBodiesMustBeText: every write endpoint answers 400, and changes nothing, when its
// JSON body holds bytes that are not UTF-8 or an escape of half a surrogate pair, in any
// field; encoding/json would have replaced them with U+FFFD and written that. Valid escapes
// (é, a surrogate pair, an escaped backslash) are accepted and stored as sent.
func TestWriteBodiesMustBeText(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 2)
	api, log := writableAPI(t, f)

	before := inboxSnapshot(t, f)
	for _, ep := range writeEndpoints {
		for _, bad := range badJSONStrings {
			body := fmt.Sprintf(ep.body, bad.literal)
			r := post(t, api+ep.path, body, nil)
			require.Equal(t, http.StatusBadRequest, r.status, "%s %q: %s", ep.path, body, r.body)
			require.Contains(t, r.errorText(t), bad.want, "%s %q", ep.path, body)
		}
	}
	// The rest of the request is checked the same way: one value, not too large.
	for _, tc := range []struct {
		body   string
		status int
		want   string
	}{
		{`{"consumer":"billing"} {"consumer":"other"}`, http.StatusBadRequest, "more than one value"},
		{`{"consumer":"billing"} x`, http.StatusBadRequest, "more than one value"},
		{`{"consumer":"billing","ordering_key":"` + strings.Repeat("k", admin.MaxBodyBytes) + `"}`, http.StatusRequestEntityTooLarge, "larger than 1048576 bytes"},
	} {
		r := post(t, api+"inbox/replay", tc.body, nil)
		require.Equal(t, tc.status, r.status, "%.80q: %s", tc.body, r.body)
		require.Contains(t, r.errorText(t), tc.want, "%.80q", tc.body)
	}
	require.Equal(t, before, inboxSnapshot(t, f), "no bad request changed a row")
	require.Empty(t, log.logged(), "bad input is not a server error")

	// Valid escapes: the text that was meant, byte for byte.
	var ch operate.ChangeResponse
	r := post(t, api+"inbox/replay", `{"consumer":"b\u00e9\ud83d\ude00","dry_run":true}`, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &ch)
	require.Equal(t, "bé😀", ch.Consumer)
	failed := f.IDs(t, "FAILED")
	r = post(t, api+"inbox/skip", fmt.Sprintf(`{"consumer":"billing","ids":[%d],"reason":"caf\u00e9 \ud83d\ude00 \\ud800 \uD83D\uDE00"}`, failed[0]), nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &ch)
	require.Equal(t, 1, ch.Rows)
	require.Equal(t, 1, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("inbox")+` WHERE id = $1 AND starts_with(last_error, $2)`,
		failed[0], `skipped: café 😀 \ud800 😀`))
}

// TestQueryStringsMustBeText: every GET endpoint answers 400 for a query string that does not
// parse, or that holds a parameter name or value that is not text (NUL, invalid UTF-8, sent
// percent-encoded or raw), whether or not it reads that parameter. URL.Query would have
// dropped a malformed parameter and answered as if it had not been given.
func TestQueryStringsMustBeText(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 1)
	api, log := writableAPI(t, f)

	endpoints := []string{"status", "consumers", "inbox?consumer=billing", "inbox/stats", "inbox/1", "outbox",
		"outbox/rejected", "outbox/rejected/1", "history", "dedupe?consumer=rewards&message=m-1"}
	bad := []struct{ query, want string }{
		{"consumer=%FF", "consumer must be valid UTF-8"},
		{"consumer=bill%C3", "consumer must be valid UTF-8"},
		{"consumer=%ED%A0%80", "consumer must be valid UTF-8"}, // a surrogate encoded as UTF-8
		{"consumer=\xff", "consumer must be valid UTF-8"},      // sent raw
		{"unread=%FF", "unread must be valid UTF-8"},
		{"%FF=1", "a query parameter name must be valid UTF-8"},
		{"relay=a%00", "relay must not contain NUL"},
		{"status=%zz", `the query string is malformed: invalid URL escape "%zz"`},
		{"window=day;relay=x", "the query string is malformed: invalid semicolon separator"},
	}
	for _, ep := range endpoints {
		for _, b := range bad {
			path, query, _ := strings.Cut(ep, "?")
			if query != "" {
				query += "&"
			}
			query += b.query
			r := getRaw(t, api+path, query)
			require.Equal(t, http.StatusBadRequest, r.status, "%s?%s: %s", path, query, r.body)
			require.Contains(t, r.errorText(t), b.want, "%s?%s", path, query)
		}
	}
	// Writes check their query string too.
	r := post(t, api+"inbox/replay?x=%FF", operate.ChangeRequest{Consumer: "billing"}, nil)
	require.Equal(t, http.StatusBadRequest, r.status, string(r.body))
	require.Equal(t, 1, f.Count(t, "FAILED"))

	// Percent-encoded UTF-8 is text.
	for _, path := range []string{"inbox?consumer=b%C3%A9", "history?consumer=%F0%9F%98%80", "dedupe?consumer=r%C3%A9&message=%E2%82%AC"} {
		r := get(t, api+path)
		require.Equal(t, http.StatusOK, r.status, "%s: %s", path, r.body)
	}
	require.Empty(t, log.logged(), "bad input is not a server error")
}

// writableAPI serves f's schema with writes allowed and returns the API's URL and the log of
// the errors it reports.
func writableAPI(t *testing.T, f *admintest.Fixture) (string, *errorLog) {
	t.Helper()
	log := &errorLog{}
	h, err := admin.NewHandler(f.DB, admin.Config{Schema: f.Schema, AllowWrites: true, SampleInterval: -1}, log)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + "/api/", log
}

// getRaw GETs url with rawQuery as its query string, byte for byte (net/url would escape raw
// bytes that are not ASCII).
func getRaw(t *testing.T, url, rawQuery string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.URL.RawQuery = rawQuery
	return send(t, req)
}
