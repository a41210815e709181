package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Rows a broker refused for the same reason (their errors differ in sizes and addresses only)
// are one group per topic; the group is republished, or discarded, as a whole, and a dry run
// lists exactly the offsets either would touch.
func TestRejectedGroupsRepublishAndDiscard(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	publishTx(t, db, w, "big", "b-1", "b-2", "b-3")
	publishTx(t, db, w, "gone", "g-1", "g-2")
	var refuse atomic.Bool
	refuse.Store(true)
	s := &sink{failOn: func(topic string, msgs []*message.Message) error {
		if !refuse.Load() {
			return nil
		}
		switch topic {
		case "big":
			return wmonce.Permanent(fmt.Errorf("kafka 10.1.2.%d:9092: message of %d bytes too large", len(msgs[0].UUID)*7, len(msgs[0].UUID)*1000+len(msgs)))
		case "gone":
			return wmonce.Permanent(errors.New("topic does not exist"))
		}
		return nil
	}}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, Name: "kafka", BatchSize: 1}, nil)
	require.NoError(t, err)
	for r.Counters().Rejected < 5 {
		require.NotZero(t, relayOnce(t, r), "the relay stopped with %d of 5 rows rejected", r.Counters().Rejected)
	}

	groups, left, err := outboxops.RejectedGroups(ctx, db, schema, 0)
	require.NoError(t, err)
	require.Zero(t, left)
	require.Len(t, groups, 2, "%+v", groups)
	big, gone := groups[0], groups[1]
	require.Equal(t, int64(3), big.Rows)
	require.Equal(t, "kafka", big.Relay)
	require.Equal(t, "big", big.Topic)
	require.True(t, strings.HasSuffix(big.Pattern, "kafka <addr>: message of <n> bytes too large"), big.Pattern)
	require.Equal(t, int64(2), gone.Rows)
	require.NotEqual(t, big.Fingerprint, gone.Fingerprint)

	dry, err := outboxops.RepublishRejectedGroup(ctx, db, schema, outboxops.RejectedGroupRequest{Fingerprint: big.Fingerprint, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, "kafka", dry.Relay)
	require.Len(t, dry.Offsets, 3)
	refuse.Store(false)
	done, err := outboxops.RepublishRejectedGroup(ctx, db, schema, outboxops.RejectedGroupRequest{Fingerprint: big.Fingerprint, Offsets: dry.Offsets[:2]})
	require.NoError(t, err)
	require.Equal(t, dry.Offsets[:2], done.Offsets, "only the offsets asked for")
	drain(t, r, s, 2)
	require.Equal(t, []string{"big/b-1", "big/b-2"}, s.all())

	dryDiscard, err := outboxops.DiscardRejectedGroup(ctx, db, schema, outboxops.RejectedGroupRequest{Fingerprint: gone.Fingerprint, DryRun: true})
	require.NoError(t, err)
	require.Len(t, dryDiscard.Offsets, 2)
	require.Equal(t, 3, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox_rejected")), "a dry run deletes nothing")
	discarded, err := outboxops.DiscardRejectedGroup(ctx, db, schema, outboxops.RejectedGroupRequest{Fingerprint: gone.Fingerprint})
	require.NoError(t, err)
	require.Equal(t, dryDiscard.Offsets, discarded.Offsets)
	remaining, _, err := outboxops.RejectedGroups(ctx, db, schema, 0)
	require.NoError(t, err)
	require.Len(t, remaining, 1)
	require.Equal(t, big.Fingerprint, remaining[0].Fingerprint)
	require.Equal(t, int64(1), remaining[0].Rows, "b-3 was not asked for and stays")

	_, err = outboxops.DiscardRejectedGroup(ctx, db, schema, outboxops.RejectedGroupRequest{Fingerprint: "ABC"})
	require.ErrorContains(t, err, "fingerprint must be 16 lower-case hex digits")
}
