package admin_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// GET /api/failures groups the parked inbox rows and the rejected outbox rows; POST
// /api/failures/act runs an action on a group behind the write guard, and its dry run lists
// the rows it would touch. Each kind refuses the action it does not take.
func TestFailureGroupsThroughTheAPI(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 3)
	relay, pub := f.KafkaRejects(t, "m-2")
	// Two messages the poison queue parked, as once.Stack parks them.
	w, err := outbox.NewWriter(outbox.Config{Schema: f.Schema})
	require.NoError(t, err)
	for _, id := range []string{"evt-17", "evt-18"} {
		m := message.NewMessage(id, []byte(`{}`))
		m.Metadata.Set(middleware.ReasonForPoisonedKey, "permanent: unknown currency XYZ in "+id)
		m.Metadata.Set(middleware.PoisonedTopicKey, "payments")
		m.Metadata.Set(middleware.PoisonedHandlerKey, "ledger")
		require.NoError(t, w.ParkingPublisher(f.DB).Publish("payments-poison", m))
	}
	ro := f.Server(t, admin.Config{})
	var groups operate.FailureGroupsResponse
	get(t, ro.URL+"/api/failures").decode(t, &groups)
	require.Len(t, groups.Groups, 5, "%+v", groups.Groups)
	billing := groups.Groups[0]
	require.Equal(t, operate.FailureGroup{
		Kind: operate.FailureKindInbox, Fingerprint: billing.Fingerprint, Consumer: "billing", Pattern: "card declined: <b>insufficient funds</b>",
		Example: "card declined: <b>insufficient funds</b>", Rows: 3, FirstSeen: billing.FirstSeen, LastSeen: billing.LastSeen,
		Actions: []string{operate.ActionReplay, operate.ActionSkip},
	}, billing)
	cashback := admintest.FailureGroup(t, groups.Groups, operate.FailureKindRejected, "kafka", "cashback")
	require.Equal(t, []string{operate.ActionReplay, operate.ActionDiscard}, cashback.Actions)
	parked := admintest.FailureGroup(t, groups.Groups, operate.FailureKindParked, "ledger", "payments")
	require.Equal(t, "permanent: unknown currency XYZ in evt-<n>", parked.Pattern)
	require.Equal(t, int64(2), parked.Rows)
	require.Equal(t, []string{operate.ActionReplay, operate.ActionDiscard}, parked.Actions)
	legacy := admintest.FailureGroup(t, groups.Groups, operate.FailureKindRejected, "sms", "")
	require.Equal(t, int64(1), legacy.Rows)
	require.Equal(t, []string{operate.ActionDiscard}, legacy.Actions, "undecodable rows would only be rejected again")
	require.Equal(t, operate.DefaultFailureGroupRows, groups.MaxRows)
	require.Zero(t, groups.LeftOut)
	var newest operate.FailureGroupsResponse
	get(t, ro.URL+"/api/failures?max_rows=1").decode(t, &newest)
	require.Equal(t, int64(5), newest.LeftOut, "all but the newest row of each kind: 2 of billing's 3, 1 of the 2 parked, 2 of the 3 rejected")
	r := get(t, ro.URL+"/api/failures?max_rows=-1")
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Contains(t, r.errorText(t), "max_rows must be a non-negative integer")
	require.Equal(t, http.StatusForbidden, post(t, ro.URL+"/api/failures/act", operate.FailureActionRequest{
		Kind: operate.FailureKindInbox, Fingerprint: billing.Fingerprint, Action: operate.ActionReplay,
	}, nil).status, "writes need AllowWrites")

	srv := f.Server(t, admin.Config{AllowWrites: true})
	act := func(req operate.FailureActionRequest) operate.FailureActionResponse {
		t.Helper()
		r := post(t, srv.URL+"/api/failures/act", req, nil)
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		var out operate.FailureActionResponse
		r.decode(t, &out)
		return out
	}
	dry := act(operate.FailureActionRequest{Kind: operate.FailureKindInbox, Fingerprint: billing.Fingerprint, Action: operate.ActionSkip, DryRun: true})
	require.Equal(t, f.IDs(t, "FAILED"), dry.IDs)
	require.Equal(t, 3, dry.Rows)
	require.Equal(t, 3, f.Count(t, "FAILED"), "a dry run changes nothing")
	done := act(operate.FailureActionRequest{Kind: operate.FailureKindInbox, Fingerprint: billing.Fingerprint, Action: operate.ActionSkip, IDs: dry.IDs[:2], Reason: "paid by transfer"})
	require.Equal(t, dry.IDs[:2], done.IDs)
	require.Equal(t, 2, f.Count(t, "SKIPPED"))
	require.Equal(t, 1, f.Count(t, "FAILED"))

	pub.Refuse = nil
	re := act(operate.FailureActionRequest{Kind: operate.FailureKindRejected, Fingerprint: cashback.Fingerprint, Action: operate.ActionReplay})
	require.Equal(t, "kafka", re.Relay)
	require.Len(t, re.IDs, 1)
	before := relay.Counters().Forwarded
	admintest.RelayUntil(t, relay, "forward the republished row", func(st outbox.RelayCounters) bool { return st.Forwarded > before })
	gone := act(operate.FailureActionRequest{Kind: operate.FailureKindRejected, Fingerprint: legacy.Fingerprint, Action: operate.ActionDiscard})
	require.Equal(t, "sms", gone.Relay)
	require.Len(t, gone.IDs, 1)
	replayed := act(operate.FailureActionRequest{Kind: operate.FailureKindParked, Fingerprint: parked.Fingerprint, Action: operate.ActionReplay})
	require.Len(t, replayed.IDs, 2)
	require.Equal(t, 2, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("outbox")+` WHERE payload->>'destination_topic' = 'payments' AND metadata->>'reason_poisoned' IS NULL`),
		"the originals, stored again for the topic they were consumed from")
	get(t, srv.URL+"/api/failures").decode(t, &groups)
	require.Len(t, groups.Groups, 2, "billing's last row and kafka's undecodable row are left: %+v", groups.Groups)

	// A group with no row to act on is 404, as `wmonce failures` exits 1 for it: an unknown
	// fingerprint, or one whose rows were handled already (before, 200 {"rows":0}).
	for _, req := range []operate.FailureActionRequest{
		{Kind: operate.FailureKindRejected, Fingerprint: "0123456789abcdef", Action: operate.ActionReplay},
		{Kind: operate.FailureKindRejected, Fingerprint: gone.Fingerprint, Action: operate.ActionDiscard},
		{Kind: operate.FailureKindParked, Fingerprint: parked.Fingerprint, Action: operate.ActionReplay, DryRun: true},
		{Kind: operate.FailureKindInbox, Fingerprint: billing.Fingerprint, Action: operate.ActionReplay, IDs: []int64{dry.IDs[0]}},
	} {
		r := post(t, srv.URL+"/api/failures/act", req, nil)
		require.Equal(t, http.StatusNotFound, r.status, "%+v: %s", req, r.body)
		require.Contains(t, r.errorText(t), "group has fingerprint "+req.Fingerprint)
	}

	for _, tc := range []struct {
		body any
		want string
	}{
		{operate.FailureActionRequest{Kind: operate.FailureKindInbox, Fingerprint: "x", Action: operate.ActionReplay}, "fingerprint must be 16"},
		{operate.FailureActionRequest{Kind: operate.FailureKindInbox, Fingerprint: billing.Fingerprint, Action: operate.ActionDiscard}, "inbox rows are not discarded"},
		{operate.FailureActionRequest{Kind: operate.FailureKindInbox, Fingerprint: billing.Fingerprint, Action: operate.ActionSkip}, "reason is required"},
		{operate.FailureActionRequest{Kind: operate.FailureKindRejected, Fingerprint: cashback.Fingerprint, Action: operate.ActionSkip}, "not skipped"},
		{operate.FailureActionRequest{Kind: operate.FailureKindParked, Fingerprint: parked.Fingerprint, Action: operate.ActionSkip}, "parked messages are not skipped"},
		{operate.FailureActionRequest{Kind: "intent", Fingerprint: cashback.Fingerprint, Action: operate.ActionSkip}, `kind "intent"`},
		{operate.FailureActionRequest{Kind: operate.FailureKindInbox, Fingerprint: billing.Fingerprint, Action: operate.ActionReplay, IDs: []int64{0}}, "positive"},
		{`{"kind":"inbox","fingerprint":"` + billing.Fingerprint + `","action":"replay","extra":1}`, "unknown field"},
	} {
		r := post(t, srv.URL+"/api/failures/act", tc.body, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%v: %s", tc.body, r.body)
		require.Contains(t, r.errorText(t), tc.want)
	}
}

// Of four concurrent replays of one parked group, one stores the originals and reports them;
// every other one changed nothing and says so as ErrNoFailureGroup (404, exit 1), whether it
// found the group already settled or lost the race to settle it. One copy of each original is
// stored.
func TestConcurrentParkedReplaysReportWhatTheyDid(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	for _, id := range []string{"o-1", "o-2", "o-3"} {
		m := message.NewMessage(id, []byte(`{}`))
		m.Metadata.Set(middleware.ReasonForPoisonedKey, "order not found")
		m.Metadata.Set(middleware.PoisonedTopicKey, "orders")
		m.Metadata.Set(middleware.PoisonedHandlerKey, "billing")
		require.NoError(t, w.ParkingPublisher(db).Publish("poison", m))
	}
	groups, _, err := outboxops.ParkedGroups(ctx, db, schema, 0)
	require.NoError(t, err)
	require.Len(t, groups, 1)
	const racers = 4
	results := make([]operate.FailureActionResponse, racers)
	errs := make([]error, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = operate.ActOnFailureGroup(ctx, db, schema, operate.FailureActionRequest{
				Kind: operate.FailureKindParked, Fingerprint: groups[0].Fingerprint, Action: operate.ActionReplay})
		}()
	}
	wg.Wait()
	done := 0
	for i := range racers {
		if errs[i] == nil {
			done++
			require.Equal(t, 3, results[i].Rows)
			continue
		}
		require.ErrorIs(t, errs[i], operate.ErrNoFailureGroup)
	}
	require.Equal(t, 1, done, "%v", errs)
	require.Equal(t, 3, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")+` WHERE payload->>'destination_topic' = 'orders'`))
}
