package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
)

// A paused relay publishes nothing, whether it runs or is driven by RelayOnce, and shows the
// pause in Counters and Stats; resumed, it publishes what waited, in order. The pause notifies
// the relay, whose PollInterval is an hour: it sees the pause and the resume at once.
func TestRelayPauseAndResume(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	sink := newKeyedSink(1)
	r, err := outbox.NewRelay(db, sink, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour}, nil)
	require.NoError(t, err)
	_, err = outbox.PauseRelay(ctx, db, schema, "relay")
	require.ErrorIs(t, err, outbox.ErrRelayNotFound, "a relay that never ran")

	sig := outbox.RelaySignals(r)
	sig.Paused.Init()
	startRelay(t, r)
	done := sink.expect(1)
	publishTx(t, db, w, "orders", "before")
	testwait.Closed(t, done, "the message stored before the pause")

	changed, err := outbox.PauseRelay(ctx, db, schema, "relay")
	require.NoError(t, err)
	require.True(t, changed)
	changed, err = outbox.PauseRelay(ctx, db, schema, "relay")
	require.NoError(t, err)
	require.False(t, changed, "paused already")
	sig.Paused.WaitOrTimeout()
	require.True(t, r.Counters().Paused)
	publishTx(t, db, w, "orders", "while-1", "while-2")
	delayed := time.Now().Add(time.Millisecond)
	storeAt(t, db, w, delayed, "orders", keyed("while-delayed", "k"))
	// RelayOnce reads the pause itself: it publishes nothing either.
	once, err := outbox.NewRelay(db, sink, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	require.Zero(t, relayOnce(t, once), "RelayOnce of a paused relay")
	require.Equal(t, []string{"before"}, sink.all())
	relays, _, err := outbox.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.False(t, relays[0].PausedAt.IsZero(), "Stats shows the pause")
	require.Equal(t, int64(3), relays[0].Backlog)

	done = sink.expect(4)
	changed, err = outbox.ResumeRelay(ctx, db, schema, "relay")
	require.NoError(t, err)
	require.True(t, changed)
	testwait.Closed(t, done, "the rows that waited, after the resume")
	require.Equal(t, []string{"before", "while-1", "while-2", "while-delayed"}, sink.all())
	require.False(t, r.Counters().Paused)
	relays, _, err = outbox.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.True(t, relays[0].PausedAt.IsZero())
}

// A pause holds for the relay name, not for one instance: an instance that starts leading
// while the relay is paused (in another process, after a restart) publishes nothing until the
// resume either.
func TestRelayPauseHoldsForEveryInstance(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	sink := newKeyedSink(1)
	first, err := outbox.NewRelay(db, sink, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour}, nil)
	require.NoError(t, err)
	require.Zero(t, relayOnce(t, first), "registers the name")
	_, err = outbox.PauseRelay(ctx, db, schema, "relay")
	require.NoError(t, err)
	publishTx(t, db, w, "orders", "waits")

	second, err := outbox.NewRelay(db, sink, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour, StandbyInterval: 10 * time.Millisecond}, nil)
	require.NoError(t, err)
	sig := outbox.RelaySignals(second)
	sig.Paused.Init()
	startRelay(t, second)
	sig.Paused.WaitOrTimeout()
	require.Empty(t, sink.all(), "the new leader of a paused relay published")

	done := sink.expect(1)
	_, err = outbox.ResumeRelay(ctx, db, schema, "relay")
	require.NoError(t, err)
	testwait.Closed(t, done, "the row, after the resume")
	require.Equal(t, []string{"waits"}, sink.all())
}
