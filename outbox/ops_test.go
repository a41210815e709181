package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Prune deletes only old rows that every relay in outbox_offsets has published; a relay name
// that no longer runs holds rows back until ForgetRelay removes it.
func TestPruneDeletesOnlyOldRowsEveryRelayPublished(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	ob := pgtx.QualifiedName(schema, "outbox")
	for _, u := range []string{"m-0", "m-1", "m-2", "m-3"} {
		publishTx(t, db, w, "a", u)
	}
	pgtest.Exec(t, db, `UPDATE `+ob+` SET created_at = created_at - interval '2 days'`)

	n, err := outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 2})
	require.NoError(t, err)
	require.Zero(t, n, "no relay has ever run: nothing is known to be forwarded")

	fast, slow := &sink{}, &sink{}
	rf, err := outbox.NewRelay(db, fast, outbox.RelayConfig{Schema: schema, Name: "fast"}, nil)
	require.NoError(t, err)
	rs, err := outbox.NewRelay(db, slow, outbox.RelayConfig{Schema: schema, Name: "slow", BatchSize: 1}, nil)
	require.NoError(t, err)
	drain(t, rf, fast, 4)
	drain(t, rs, slow, 1)
	n, err = outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "only the row the slowest relay published")

	pgtest.Exec(t, db, `UPDATE `+ob+` SET created_at = localtimestamp WHERE uuid = 'm-3'`)
	drain(t, rs, slow, 4)
	n, err = outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 1})
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "the young row stays for keep")

	pgtest.Exec(t, db, `UPDATE `+ob+` SET created_at = created_at - interval '2 days'`)
	pgtest.Exec(t, db, `INSERT INTO `+pgtx.QualifiedName(schema, "outbox_offsets")+` (consumer_group, offset_acked, last_processed_transaction_id) VALUES ('retired', 0, '0')`)
	n, err = outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 2})
	require.NoError(t, err)
	require.Zero(t, n, "a retired relay holds rows back")
	found, err := outbox.ForgetRelay(ctx, db, schema, "retired")
	require.NoError(t, err)
	require.True(t, found)
	n, err = outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+ob))

	_, err = outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: time.Hour, BatchSize: -1})
	require.ErrorContains(t, err, "BatchSize must be positive")
	_, err = outbox.Prune(ctx, db, `bad"schema`, pgtx.PruneRequest{Keep: time.Hour, BatchSize: 1})
	require.Error(t, err)
	_, err = outbox.Prune(ctx, nil, schema, pgtx.PruneRequest{Keep: time.Hour, BatchSize: 1})
	require.ErrorContains(t, err, "db is nil")
}

// The relay publishes by commit, not by transaction id: a transaction that wrote first and
// committed last is published after rows with larger ids. Prune must keep its row until a
// relay has published it, although rows with larger transaction ids are already gone.
func TestPruneKeepsARowWithASmallerIdCommittedLaterUntilPublished(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ob := pgtx.QualifiedName(schema, "outbox")
	ctx := context.Background()

	late, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer late.Rollback()
	require.NoError(t, w.PublishTx(ctx, late, "events", message.NewMessage("late", []byte(`{}`))))
	_, err = late.ExecContext(ctx, `UPDATE `+ob+` SET created_at = created_at - interval '2 days' WHERE transaction_id = pg_current_xact_id()`)
	require.NoError(t, err)

	publishTx(t, db, w, "events", "m-0") // a larger transaction id, committed first
	pgtest.Exec(t, db, `UPDATE `+ob+` SET created_at = created_at - interval '2 days' WHERE uuid = 'm-0'`)
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, Name: "kafka", BatchSize: 1}, nil)
	require.NoError(t, err)
	drain(t, r, s, 1)
	require.NoError(t, late.Commit())

	n, err := outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 100})
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the published row goes")
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+ob+` WHERE uuid = 'late'`), "the unpublished row with the smaller id stays")

	drain(t, r, s, 2)
	n, err = outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 100})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+ob))
}

func TestForgetRelayRefusesARunningRelay(t *testing.T) {
	t.Parallel()
	db, schema, _ := setup(t)
	ctx := context.Background()
	r, err := outbox.NewRelay(db, &sink{}, outbox.RelayConfig{Schema: schema, Name: "live", PollInterval: 10 * time.Millisecond}, nil)
	require.NoError(t, err)
	sig := outbox.RelaySignals(r)
	sig.Leading.Init()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	// Leading comes first (the lock), then the relay registers its position: the signal
	// comes after both.
	sig.Leading.WaitOrTimeout()
	offsets := `SELECT count(*) FROM ` + pgtx.QualifiedName(schema, "outbox_offsets")
	require.True(t, r.Counters().IsLeader)
	require.Equal(t, 1, pgtest.Count(t, db, offsets))

	found, err := outbox.ForgetRelay(ctx, db, schema, "live")
	require.ErrorIs(t, err, outbox.ErrRelayActive)
	require.False(t, found)
	require.Equal(t, 1, pgtest.Count(t, db, offsets))
	// Another relay's name, or another schema, is not held back by this lock.
	found, err = outbox.ForgetRelay(ctx, db, schema, "other")
	require.NoError(t, err)
	require.False(t, found)

	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	// A relay stopped while its connection was busy leaves the session (and lock) to end on
	// the server a moment later: an effect in another process (the server's backend), which
	// no signal of the relay can announce, so this one wait polls.
	testwait.Until(t, "ForgetRelay to succeed once the relay's session ended", func() bool {
		found, err = outbox.ForgetRelay(ctx, db, schema, "live")
		return err == nil
	})
	require.True(t, found)
	found, err = outbox.ForgetRelay(ctx, db, schema, "live")
	require.NoError(t, err)
	require.False(t, found, "already gone")
	_, err = outbox.ForgetRelay(ctx, db, schema, "")
	require.ErrorContains(t, err, "name the relay")
}

func TestListRejectedPagesByOffset(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	for _, u := range []string{"foreign-1", "foreign-2", "foreign-3"} {
		pgtest.Exec(t, db, `INSERT INTO `+pgtx.QualifiedName(schema, "outbox")+` (uuid, payload, metadata, transaction_id) VALUES ($1, '{"not":"an envelope"}', '{"k":"v"}', pg_current_xact_id())`, u)
	}
	publishTx(t, db, w, "a", "ok")
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, Name: "sms"}, nil)
	require.NoError(t, err)
	drain(t, r, s, 1)

	page, err := outboxops.ListRejected(ctx, db, schema, outboxops.RejectedFilter{Relay: "sms"}, 2, false)
	require.NoError(t, err)
	require.Len(t, page, 2)
	require.Equal(t, "foreign-1", page[0].UUID)
	require.Nil(t, page[0].Payload, "lists leave the payload out")
	require.Equal(t, len(`{"not":"an envelope"}`), page[0].PayloadSize)
	require.Contains(t, page[0].LastError, "destination_topic")

	rest, err := outboxops.ListRejected(ctx, db, schema, outboxops.RejectedFilter{AfterOffset: page[1].Offset}, 10, true)
	require.NoError(t, err)
	require.Len(t, rest, 1)
	require.Equal(t, "foreign-3", rest[0].UUID)
	require.NotNil(t, rest[0].Payload)
	require.JSONEq(t, `{"not":"an envelope"}`, *rest[0].Payload)
	require.JSONEq(t, `{"k":"v"}`, string(rest[0].Metadata))

	none, err := outboxops.ListRejected(ctx, db, schema, outboxops.RejectedFilter{Relay: "kafka"}, 10, false)
	require.NoError(t, err)
	require.Empty(t, none)
	_, err = outboxops.ListRejected(ctx, db, schema, outboxops.RejectedFilter{}, 0, false)
	require.ErrorContains(t, err, "limit must be positive")
}
