package admin_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/outbox"
)

// POST /api/outbox/republish stores a row the broker refused in the outbox again, once the
// cause is fixed; a row that cannot be decoded stays rejected. Both writes need AllowWrites.
func TestRepublishRejectedRowsThroughTheAPI(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 1)
	relay, pub := f.KafkaRejects(t, "m-2")
	ro := f.Server(t, admin.Config{})
	require.Equal(t, http.StatusForbidden, post(t, ro.URL+"/api/outbox/republish", operate.RepublishRequest{Relay: "kafka", All: true}, nil).status)
	require.Equal(t, http.StatusForbidden, post(t, ro.URL+"/api/outbox/forget", operate.ForgetRequest{Relay: "sms"}, nil).status)

	srv := f.Server(t, admin.Config{AllowWrites: true})
	var list operate.RejectedListResponse
	get(t, srv.URL+"/api/outbox/rejected?relay=kafka").decode(t, &list)
	require.Len(t, list.Rows, 2)
	row, legacy := list.Rows[0], list.Rows[1] // m-2's row was written before legacy-7
	require.Equal(t, "cashback", row.Topic)
	require.Equal(t, "legacy-7", legacy.UUID)
	require.Empty(t, legacy.Topic, "the undecodable row has no topic")
	require.Contains(t, row.LastError, "too large")

	var res operate.RepublishResponse
	r := post(t, srv.URL+"/api/outbox/republish", operate.RepublishRequest{Relay: "kafka", Offsets: []int64{row.Offset}, DryRun: true}, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &res)
	require.Equal(t, operate.RepublishResponse{Relay: "kafka", DryRun: true, Republished: 1, Offsets: []int64{row.Offset}, Undecodable: []int64{}}, res)

	pub.Refuse = nil
	r = post(t, srv.URL+"/api/outbox/republish", operate.RepublishRequest{Relay: "kafka", Offsets: []int64{row.Offset}}, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &res)
	require.Equal(t, 1, res.Republished)
	get(t, srv.URL+"/api/outbox/rejected?relay=kafka").decode(t, &list)
	require.Len(t, list.Rows, 1, "only the undecodable row is left")
	before := relay.Counters().Forwarded
	admintest.RelayUntil(t, relay, "forward the republished row", func(st outbox.RelayCounters) bool { return st.Forwarded > before })

	// The fixture's undecodable row (relay sms) stays.
	r = post(t, srv.URL+"/api/outbox/republish", operate.RepublishRequest{Relay: "sms", All: true}, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &res)
	require.Zero(t, res.Republished)
	require.Len(t, res.Undecodable, 1)

	for _, tc := range []struct {
		body any
		want string
	}{
		{operate.RepublishRequest{All: true}, "relay is required"},
		{operate.RepublishRequest{Relay: "kafka"}, "give the offsets"},
		{operate.RepublishRequest{Relay: "kafka", All: true, Offsets: []int64{1}}, "not both"},
		{operate.RepublishRequest{Relay: "kafka", Offsets: []int64{0}}, "positive outbox offsets"},
		{`{"relay":"kafka","all":true,"extra":1}`, "unknown field"},
	} {
		r := post(t, srv.URL+"/api/outbox/republish", tc.body, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%v: %s", tc.body, r.body)
		require.Contains(t, r.errorText(t), tc.want)
	}
}

// POST /api/outbox/forget forgets a retired relay (a dry run first says what it had not
// forwarded), refuses one that runs (409) and answers 404 for a name without a position.
func TestForgetRelayThroughTheAPI(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 1)
	srv := f.Server(t, admin.Config{AllowWrites: true})

	var res operate.ForgetResponse
	r := post(t, srv.URL+"/api/outbox/forget", operate.ForgetRequest{Relay: "sms", DryRun: true}, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &res)
	require.Equal(t, int64(1), res.Backlog)
	require.True(t, res.DryRun)
	var st operate.OutboxStats
	get(t, srv.URL+"/api/outbox").decode(t, &st)
	require.Len(t, st.Relays, 1, "a dry run forgets nothing")

	r = post(t, srv.URL+"/api/outbox/forget", operate.ForgetRequest{Relay: "nope"}, nil)
	require.Equal(t, http.StatusNotFound, r.status, string(r.body))
	require.Contains(t, r.errorText(t), `"nope" (relays: "sms")`)
	r = post(t, srv.URL+"/api/outbox/forget", operate.ForgetRequest{}, nil)
	require.Equal(t, http.StatusBadRequest, r.status, string(r.body))

	live, err := outbox.NewRelay(f.DB, &admintest.RefusingPublisher{}, outbox.RelayConfig{Schema: f.Schema, Name: "live", StandbyInterval: 10 * time.Millisecond}, watermill.NopLogger{})
	require.NoError(t, err)
	leading := worker.LeadingSignal(worker.LockKey("relay", f.Schema, "live")) // the relay's lock key
	done := make(chan error, 1)
	go func() { done <- live.Run(context.Background()) }()
	t.Cleanup(func() { require.NoError(t, live.Close()); require.NoError(t, <-done) })
	leading.WaitOrTimeout()
	r = post(t, srv.URL+"/api/outbox/forget", operate.ForgetRequest{Relay: "live"}, nil)
	require.Equal(t, http.StatusConflict, r.status, string(r.body))
	require.Contains(t, r.errorText(t), "the relay is running")

	r = post(t, srv.URL+"/api/outbox/forget", operate.ForgetRequest{Relay: "sms"}, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	get(t, srv.URL+"/api/outbox").decode(t, &st)
	require.Len(t, st.Relays, 1)
	require.Equal(t, "live", st.Relays[0].Name)
}
