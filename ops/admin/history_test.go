package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/outbox"
)

func sum(vs []int64) int64 {
	var n int64
	for _, v := range vs {
		n += v
	}
	return n
}

func sumPtr(vs []*int64) (n int64, buckets int) {
	for _, v := range vs {
		if v != nil {
			n += *v
			buckets++
		}
	}
	return n, buckets
}

func maxPtr[T int64 | float64](vs []*T) (m T, ok bool) {
	for _, v := range vs {
		if v != nil && (!ok || *v > m) {
			m, ok = *v, true
		}
	}
	return m, ok
}

// The charts' series, from rows and counts the real components made: claims by the database,
// duplicates, inbox backlog and relay backlog from the handler's samples.
func TestHistoryAPI(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 2)
	ctx := context.Background()
	// A second consumer claims in the daily partitions.
	ledger, err := once.New(f.DB, once.Config{Schema: f.Schema, Consumer: "ledger", PartitionByDay: true}, nil)
	require.NoError(t, err)
	msg := message.NewMessage("l-1", []byte(`{}`))
	msg.Metadata.Set(outbox.MetadataOccurredAt, time.Now().UTC().Format(time.RFC3339Nano))
	_, err = ledger.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
	require.NoError(t, err)

	srv, h := f.Serve(t, admin.Config{Middlewares: []*once.Middleware{f.MW, ledger}, SampleInterval: -1})
	api := srv.URL + "/api/"
	require.NoError(t, h.Sample(ctx)) // the baseline: 3 fresh and 1 duplicate counted before it
	f.Deliver(t, "m-2")
	f.Deliver(t, "m-1")
	f.Deliver(t, "m-4") // fresh: a fourth claim and a second row waiting for the relay
	require.NoError(t, h.Sample(ctx))

	require.NoError(t, f.MW.Close()) // writes the duplicates per minute it has not written yet

	var hr operate.HistoryResponse
	get(t, api+"history").decode(t, &hr)
	require.Equal(t, "hour", hr.Window)
	require.Equal(t, 60, hr.Buckets)
	require.Equal(t, 60.0, hr.BucketSeconds)
	require.Equal(t, time.Hour, hr.End.Sub(hr.Start))
	require.True(t, hr.InProcessCounters)
	require.Equal(t, int64(2), hr.Sampling.Samples)
	require.Zero(t, hr.Sampling.IntervalSeconds, "background sampling is off")
	require.Len(t, hr.Consumers, 2)
	require.Equal(t, "ledger", hr.Consumers[0].Consumer)
	require.Equal(t, int64(1), sum(hr.Consumers[0].Claims), "claims in processed_messages_daily count too")
	rewards := hr.Consumers[1]
	require.Equal(t, "rewards", rewards.Consumer)
	require.Len(t, rewards.Claims, 60)
	require.Equal(t, int64(4), sum(rewards.Claims))
	dups, covered := sumPtr(rewards.Duplicates)
	require.Equal(t, int64(3), dups, "every duplicate, the one skipped before the first sample too: the database recorded them")
	require.Equal(t, 60, covered, "the database holds every bucket")

	// The standalone page (`wmonce admin`: no middlewares in its process) charts the same.
	standalone := f.Server(t, admin.Config{SampleInterval: -1})
	var sa operate.HistoryResponse
	get(t, standalone.URL+"/api/history?consumer=rewards").decode(t, &sa)
	require.False(t, sa.InProcessCounters)
	require.Len(t, sa.Consumers, 1)
	dups, _ = sumPtr(sa.Consumers[0].Duplicates)
	require.Equal(t, int64(3), dups, "duplicates without admin.Config.Middlewares")

	require.Len(t, hr.Inbox, 1)
	require.Equal(t, "billing", hr.Inbox[0].Consumer)
	failed, ok := maxPtr(hr.Inbox[0].Failed)
	require.True(t, ok)
	require.Equal(t, int64(2), failed)
	pending, _ := maxPtr(hr.Inbox[0].Pending)
	require.Zero(t, pending)
	require.Len(t, hr.Relays, 1)
	require.Equal(t, "sms", hr.Relays[0].Name)
	backlog, _ := maxPtr(hr.Relays[0].Backlog)
	require.Equal(t, int64(2), backlog)
	lag, _ := maxPtr(hr.Relays[0].LagSeconds)
	require.Greater(t, lag, 0.0)

	// Claims land in the bucket of their processed_at: move one 30 minutes and one 3 hours back.
	pgtest.Exec(t, f.DB, `UPDATE `+f.Table("processed_messages")+` SET processed_at = processed_at - interval '30 minutes' WHERE message_id = 'm-1'`)
	pgtest.Exec(t, f.DB, `UPDATE `+f.Table("processed_messages")+` SET processed_at = processed_at - interval '3 hours' WHERE message_id = 'm-2'`)
	var moved time.Time
	require.NoError(t, f.DB.QueryRow(`SELECT processed_at FROM `+f.Table("processed_messages")+` WHERE message_id = 'm-1'`).Scan(&moved))
	get(t, api+"history?consumer=rewards").decode(t, &hr)
	require.Len(t, hr.Consumers, 1, "the consumer filter")
	require.Empty(t, hr.Inbox, "billing is filtered out")
	require.Equal(t, int64(3), sum(hr.Consumers[0].Claims), "the claim 3 hours back is outside the hour")
	require.Equal(t, int64(1), hr.Consumers[0].Claims[int(moved.Sub(hr.Start)/time.Minute)])

	get(t, api+"history?window=day&relay=sms").decode(t, &hr)
	require.Equal(t, "day", hr.Window)
	require.Equal(t, 96, hr.Buckets)
	require.Equal(t, 900.0, hr.BucketSeconds)
	require.Equal(t, int64(4), sum(hr.Consumers[1].Claims))
	dups, _ = sumPtr(hr.Consumers[1].Duplicates)
	require.Equal(t, int64(3), dups, "the day's buckets too")
	require.Len(t, hr.Relays, 1)
	get(t, api+"history?relay=other").decode(t, &hr)
	require.Empty(t, hr.Relays)

	for _, tc := range []struct{ query, want string }{
		{"window=week", `window must be hour or day, got "week"`},
		{"window=%ff", "window must be valid UTF-8"},
		{"consumer=a%00b", "consumer must not contain NUL bytes"},
		{"consumer=" + strings.Repeat("c", 256), "consumer is 256 bytes long; the limit is 255"},
		{"relay=%ff", "relay must be valid UTF-8"},
	} {
		r := get(t, api+"history?"+tc.query)
		require.Equal(t, http.StatusBadRequest, r.status, tc.query)
		require.Contains(t, r.errorText(t), tc.want, tc.query)
	}
}

// Samples older than the hour leave the hour's chart but stay in the day's, merged five
// minutes at a time (largest backlog). Duplicates are not sampled: they are in the bucket of
// the minute they were skipped in.
func TestHistoryKeepsTheDayCoarse(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 1)
	ctx := context.Background()
	srv, h := f.Serve(t, admin.Config{SampleInterval: -1})
	now := time.Now()
	base := now.Add(-3 * time.Hour).Truncate(15 * time.Minute)
	require.NoError(t, admin.SampleAt(ctx, h, base))
	f.Deliver(t, "m-1")
	require.NoError(t, admin.SampleAt(ctx, h, base.Add(time.Minute))) // merged with the first
	f.Deliver(t, "m-2")
	f.Deliver(t, "m-5") // backlog 2
	require.NoError(t, admin.SampleAt(ctx, h, base.Add(6*time.Minute)))
	require.NoError(t, h.Sample(ctx))
	require.NoError(t, f.MW.Close()) // writes the duplicates per minute

	var hr operate.HistoryResponse
	get(t, srv.URL+"/api/history?window=day").decode(t, &hr)
	k := int(base.Sub(hr.Start) / (15 * time.Minute))
	require.Equal(t, int64(2), *hr.Relays[0].Backlog[k], "the largest backlog of the bucket")
	require.Zero(t, *hr.Consumers[0].Duplicates[k], "nothing was skipped three hours ago")

	get(t, srv.URL+"/api/history").decode(t, &hr)
	n, _ := sumPtr(hr.Consumers[0].Duplicates)
	require.Equal(t, int64(3), n, "the fixture's duplicate, m-1 and m-2, in the minutes they were skipped")
	backlog, _ := maxPtr(hr.Relays[0].Backlog)
	require.Equal(t, int64(2), backlog, "only the samples of the hour")
}

// Rows of outbox_rejected, as a relay set them aside, listed and opened.
func TestRejectedAPI(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 1)
	srv := f.Server(t, admin.Config{})
	api := srv.URL + "/api/outbox/rejected"

	var list operate.RejectedListResponse
	get(t, api).decode(t, &list)
	require.Len(t, list.Rows, 1)
	r := list.Rows[0]
	require.Equal(t, "sms", r.Relay)
	require.Equal(t, "legacy-7", r.UUID)
	require.Nil(t, r.Payload, "lists leave payloads out")
	require.Nil(t, r.Metadata)
	require.Equal(t, len(admintest.RejectedPayload), r.PayloadSize)
	require.Contains(t, r.LastError, "destination_topic")
	require.NotEmpty(t, r.TransactionID)
	require.WithinDuration(t, time.Now(), r.RejectedAt, time.Minute)
	require.Zero(t, list.NextAfter)

	var row operate.RejectedRow
	get(t, fmt.Sprintf("%s/%d", api, r.Offset)).decode(t, &row)
	require.Equal(t, admintest.RejectedPayload, *row.Payload)
	require.JSONEq(t, `{"source":"legacy-billing","attempt":"3"}`, string(row.Metadata))
	require.Equal(t, r.LastError, row.LastError)
	get(t, fmt.Sprintf("%s/%d?relay=sms", api, r.Offset)).decode(t, &row)
	require.Equal(t, "legacy-7", row.UUID)

	future := url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))
	for query, want := range map[string]int{
		"relay=sms": 1, "relay=other": 0, "rejected_after=" + future: 0, "rejected_before=" + future: 1,
		fmt.Sprintf("after=%d", r.Offset): 0, fmt.Sprintf("after=%d", r.Offset-1): 1,
	} {
		get(t, api+"?"+query).decode(t, &list)
		require.Len(t, list.Rows, want, query)
	}

	// A second relay rejects the same row: one offset, two rows, never split across pages.
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pub.Close() })
	push, err := outbox.NewRelay(f.DB, pub, outbox.RelayConfig{Schema: f.Schema, Name: "push"}, nil)
	require.NoError(t, err)
	admintest.RelayUntil(t, push, "reject legacy-7", func(st outbox.RelayCounters) bool { return st.Rejected >= 1 })
	get(t, api+"?limit=1").decode(t, &list)
	require.Len(t, list.Rows, 2)
	require.Equal(t, []string{"push", "sms"}, []string{list.Rows[0].Relay, list.Rows[1].Relay})
	require.Equal(t, r.Offset, list.NextAfter)
	get(t, fmt.Sprintf("%s?after=%d", api, list.NextAfter)).decode(t, &list)
	require.Empty(t, list.Rows)
	get(t, fmt.Sprintf("%s/%d?relay=push", api, r.Offset)).decode(t, &row)
	require.Equal(t, "push", row.Relay)

	for _, tc := range []struct {
		path   string
		status int
		want   string
	}{
		{fmt.Sprintf("/%d", r.Offset), 400, `was rejected by relays "push", "sms": give relay`},
		{fmt.Sprintf("/%d?relay=other", r.Offset), 404, `no rejected outbox row at offset`},
		{"/999999", 404, "no rejected outbox row at offset 999999"},
		{"/abc", 400, "the outbox offset must be a positive integer"},
		{"/0", 400, "the outbox offset must be a positive integer"},
		{"/1?relay=%00", 400, "relay must not contain NUL bytes"},
		{"?relay=%ff", 400, "relay must be valid UTF-8"},
		{"?rejected_after=yesterday", 400, "rejected_after must be an RFC 3339 time"},
		{"?rejected_before=%00", 400, "rejected_before must not contain NUL bytes"},
		{"?after=-1", 400, "after must be an outbox offset"},
		{"?limit=0", 400, "limit must be an integer between 1 and 1000"},
	} {
		res := get(t, api+tc.path)
		require.Equal(t, tc.status, res.status, tc.path)
		require.Contains(t, res.errorText(t), tc.want, tc.path)
	}
}

func TestInboxListByTime(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 2)
	srv := f.Server(t, admin.Config{})
	api := srv.URL + "/api/inbox?consumer=billing&"
	future := url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))
	past := url.QueryEscape(time.Now().Add(-time.Hour).Format(time.RFC3339Nano))
	var list operate.InboxListResponse
	for query, want := range map[string]int{
		"received_after=" + future: 0, "received_before=" + future: 3, "received_after=" + past: 3,
		"received_before=" + past: 0, "status=FAILED&received_after=" + past: 2,
	} {
		get(t, api+query).decode(t, &list)
		require.Len(t, list.Rows, want, query)
	}
	for query, want := range map[string]string{
		"received_after=2026-13-01": "received_after must be an RFC 3339 time",
		"received_before=%ff":       "received_before must be valid UTF-8",
		"received_after=%00":        "received_after must not contain NUL bytes",
	} {
		r := get(t, api+query)
		require.Equal(t, http.StatusBadRequest, r.status, query)
		require.Contains(t, r.errorText(t), want, query)
	}
}
