package admin_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/admin"
)

// POST /api/pause pauses and resumes an inbox consumer and a relay, behind the write guard;
// the stats show the pause.
func TestPauseThroughTheAPI(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 1)
	ro := f.Server(t, admin.Config{})
	require.Equal(t, http.StatusForbidden, post(t, ro.URL+"/api/pause", operate.PauseRequest{Consumer: "billing", Pause: true}, nil).status)
	srv := f.Server(t, admin.Config{AllowWrites: true})

	var res operate.PauseResponse
	r := post(t, srv.URL+"/api/pause", operate.PauseRequest{Consumer: "billing", Pause: true}, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &res)
	require.True(t, res.Changed)
	r = post(t, srv.URL+"/api/pause", operate.PauseRequest{Relay: "sms", Pause: true}, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	var in struct{ Consumers []operate.InboxStats }
	get(t, srv.URL+"/api/inbox/stats").decode(t, &in)
	require.NotNil(t, in.Consumers[0].PausedAt, "billing shows as paused")
	var out operate.OutboxStats
	get(t, srv.URL+"/api/outbox").decode(t, &out)
	require.NotNil(t, out.Relays[0].PausedAt, "sms shows as paused")

	r = post(t, srv.URL+"/api/pause", operate.PauseRequest{Relay: "nope", Pause: true}, nil)
	require.Equal(t, http.StatusNotFound, r.status, string(r.body))
	r = post(t, srv.URL+"/api/pause", operate.PauseRequest{Relay: "sms", Consumer: "billing"}, nil)
	require.Equal(t, http.StatusBadRequest, r.status, string(r.body))
	r = post(t, srv.URL+"/api/pause", operate.PauseRequest{Consumer: "billing"}, nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &res)
	require.True(t, res.Changed, "resumed")
	require.Zero(t, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("inbox_paused")))
}
