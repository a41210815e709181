package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/inboxops"
)

// A poison storm whose errors differ only in ids, addresses and numbers is one failure group;
// a dry run lists its rows, and a replay given those ids replays exactly them, leaving a row
// that joined the group since alone. Skip of another group keeps its rows as dedupe records.
func TestFailureGroupsReplayAndSkip(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	var healed atomic.Bool
	cfg := fast("c")
	cfg.MaxAttempts = 1
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		switch {
		case strings.HasPrefix(string(m.Payload), "charge") && !healed.Load():
			return nil, fmt.Errorf("charge %s failed: dial tcp 10.0.0.%d:5432: connection refused (request 3f2a9c1e-1b2c-4d5e-8f90-%012d)", m.UUID, len(m.UUID), len(m.UUID))
		case string(m.Payload) == "bad":
			return nil, errors.New("payload is not JSON")
		}
		return nil, e.effect(m, "w")
	}, cfg)
	for i := range 3 {
		require.NoError(t, r.Handle(msg(fmt.Sprintf("charge-%d", i*37), "charge")))
	}
	require.NoError(t, r.Handle(msg("b-1", "bad")))
	require.NoError(t, r.Handle(msg("ok-1", "fine")))
	p.until(t, "parking", func(n tally) bool { return n.Parked == 4 && n.Done == 1 })

	groups, left, err := inboxops.FailureGroups(ctx, e.ops, 0)
	require.NoError(t, err)
	require.Zero(t, left)
	require.Len(t, groups, 2, "%+v", groups)
	charge, bad := groups[0], groups[1]
	require.Equal(t, int64(3), charge.Rows)
	require.Equal(t, "c", charge.Consumer)
	require.Equal(t, "charge charge-<n> failed: dial tcp <addr>: connection refused (request <uuid>)", charge.Pattern)
	require.Contains(t, charge.Example, "charge charge-")
	require.Len(t, charge.Fingerprint, 16)
	require.False(t, charge.FirstSeen.After(charge.LastSeen))
	require.Equal(t, int64(1), bad.Rows)
	require.Equal(t, "payload is not JSON", bad.Pattern)
	newest, left, err := inboxops.FailureGroups(ctx, e.ops, 2)
	require.NoError(t, err)
	require.Equal(t, int64(2), left, "the two oldest FAILED rows are left out")
	var grouped int64
	for _, g := range newest {
		grouped += g.Rows
	}
	require.Equal(t, int64(2), grouped, "the groups cover the newest rows only")
	_, _, err = inboxops.FailureGroups(ctx, e.ops, -1)
	require.ErrorContains(t, err, "maxRows must not be negative")

	dry, err := inboxops.ReplayGroup(ctx, e.ops, inboxops.GroupRequest{Fingerprint: charge.Fingerprint, DryRun: true})
	require.NoError(t, err)
	require.Len(t, dry.IDs, 3)
	require.Equal(t, 4, e.status(t, "c", inbox.StatusFailed), "a dry run changes nothing")

	// A fourth copy of the storm joins the group after the dry run.
	require.NoError(t, r.Handle(msg("charge-999", "charge")))
	p.until(t, "the late row parked", func(n tally) bool { return n.Parked == 5 })
	healed.Store(true)
	done, err := inboxops.ReplayGroup(ctx, e.ops, inboxops.GroupRequest{Fingerprint: charge.Fingerprint, IDs: dry.IDs})
	require.NoError(t, err)
	require.Equal(t, dry.IDs, done.IDs, "exactly the rows the dry run listed")
	p.until(t, "the replayed rows", func(n tally) bool { return n.Done == 4 })
	late, err := e.ops.InspectMessage(ctx, "c", "charge-999")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusFailed, late.Status, "a row that joined after the dry run is left alone")

	_, err = inboxops.SkipGroup(ctx, e.ops, inboxops.GroupRequest{Fingerprint: bad.Fingerprint}, "")
	require.ErrorContains(t, err, "give a reason")
	skipped, err := inboxops.SkipGroup(ctx, e.ops, inboxops.GroupRequest{Fingerprint: bad.Fingerprint}, "broken producer, ticket 12")
	require.NoError(t, err)
	require.Len(t, skipped.IDs, 1)
	row, err := e.ops.InspectMessage(ctx, "c", "b-1")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusSkipped, row.Status)
	require.Equal(t, "skipped: broken producer, ticket 12; last error: payload is not JSON", row.LastError)

	_, err = inboxops.ReplayGroup(ctx, e.ops, inboxops.GroupRequest{Fingerprint: "not-a-fingerprint"})
	require.ErrorContains(t, err, "fingerprint must be 16 lower-case hex digits")
	none, err := inboxops.ReplayGroup(ctx, e.ops, inboxops.GroupRequest{Fingerprint: bad.Fingerprint})
	require.NoError(t, err)
	require.Empty(t, none.IDs, "a group whose rows are gone touches nothing")
}
