package inbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
)

// A message carrying Watermill's delay metadata is stored at once and processed not before it
// is due; one without it, received after, is processed first.
func TestProcessorHonoursDelayMetadata(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	late := msg("late", "x")
	delay.Message(late, delay.For(2500*time.Millisecond)) // RFC 3339 to the second: 1.5s at least
	due, ok, err := outboxops.DueAt(late.Metadata)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, r.Handle(late))
	require.NoError(t, r.Handle(msg("now", "x")))

	ran := make(chan handled, 2)
	cfg := fast("c")
	cfg.PollInterval = 20 * time.Millisecond
	e.start(t, func(m *message.Message) ([]*message.Message, error) {
		ran <- handled{uuid: m.UUID, at: time.Now()}
		return nil, nil
	}, cfg)
	first := testwait.Receive(t, ran, "the message without delay")
	require.Equal(t, "now", first.uuid)
	second := testwait.Receive(t, ran, "the delayed message")
	require.Equal(t, "late", second.uuid)
	require.False(t, second.at.Before(due), "processed at %s, due at %s", second.at, due)
}

type handled struct {
	uuid string
	at   time.Time
}

// The Receiver refuses, for good, a message whose delay metadata is not a time, rather than
// guess when to process it.
func TestReceiverRefusesUnreadableDelayMetadata(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	err := r.Handle(msg("bad", "x", outbox.MetadataDelayedUntil, "soon"))
	require.Error(t, err)
	require.True(t, wmonce.IsPermanent(err), "refused for good: %v", err)
	require.ErrorIs(t, err, wmonce.ErrMalformedMetadata)
}

// Two Processor instances on one schema both honour a pause: once it has committed, neither
// claims the rows stored after it, each having looked (a claim that began after they were
// stored took nothing); after Resume both claim again (each holds one row in its handler at
// once). PollInterval is an hour: the Receiver's and Resume's notifications wake them.
func TestPauseHoldsEveryProcessorOfTheConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})

	var started sync.WaitGroup
	started.Add(2)
	release := make(chan struct{})
	procs := make([]*proc, 2)
	for i := range procs {
		cfg := fast("c")
		cfg.Workers, cfg.BatchSize, cfg.PollInterval = 1, 1, time.Hour
		var once sync.Once
		p := e.processor(t, func(m *message.Message) ([]*message.Message, error) {
			once.Do(started.Done) // this processor holds a row
			select {
			case <-release:
			case <-m.Context().Done(): // the test failed: let Close end it
				return nil, m.Context().Err()
			}
			return nil, e.effect(m, "p")
		}, cfg)
		sig := p.TestSignals()
		sig.Claimed.Init()
		sig.Settled.Init()
		sig.Idle.Init()
		e.run(t, p)
		procs[i] = &proc{Processor: p, sig: sig}
	}

	paused, err := e.ops.Pause(ctx, "c")
	require.NoError(t, err)
	require.True(t, paused)
	paused, err = e.ops.Pause(ctx, "c")
	require.NoError(t, err)
	require.False(t, paused, "paused already")
	require.NoError(t, r.Handle(msg("m1", "x")))
	require.NoError(t, r.Handle(msg("m2", "x")))
	// A claim that begins after this has rows to take; m3's notification makes each
	// processor begin one.
	stored := time.Now()
	require.NoError(t, r.Handle(msg("m3", "x")))
	for _, p := range procs {
		p.sig.Idle.WaitFor(func(began time.Time) bool { return began.After(stored) })
		require.Zero(t, p.Counters().Claimed, "a paused consumer's processor claimed a row")
	}
	require.Equal(t, 3, e.status(t, "c", inbox.StatusPending))
	st, err := e.ops.Stats(ctx, "c")
	require.NoError(t, err)
	require.False(t, st.PausedAt.IsZero(), "Stats shows the pause")
	all, err := e.ops.AllStats(ctx)
	require.NoError(t, err)
	require.False(t, all["c"].PausedAt.IsZero())

	resumed, err := e.ops.Resume(ctx, "c")
	require.NoError(t, err)
	require.True(t, resumed)
	both := make(chan struct{})
	go func() { started.Wait(); close(both) }()
	testwait.Closed(t, both, "both processors to claim a row after the resume")
	close(release)
	untilSettled(t, "every row done", func() bool { return e.effects(t) == 3 }, procs...)
	st, err = e.ops.Stats(ctx, "c")
	require.NoError(t, err)
	require.True(t, st.PausedAt.IsZero())
}

// Per-key order holds across a delay: the later row of a delayed row's ordering key waits for
// it, while a row of another key goes first.
func TestDelayedRowHoldsBackItsOrderingKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c", OrderingKey: orderByMetadataKey})
	late := msg("late", "x", "key", "k")
	delay.Message(late, delay.For(2500*time.Millisecond)) // 1.5s at least: the margin for "other" to go first
	due, _, err := outboxops.DueAt(late.Metadata)
	require.NoError(t, err)
	require.NoError(t, r.Handle(late))
	require.NoError(t, r.Handle(msg("k-next", "x", "key", "k")))
	require.NoError(t, r.Handle(msg("other", "x", "key", "j")))

	ran := make(chan handled, 3)
	cfg := fast("c")
	cfg.PollInterval = 20 * time.Millisecond
	e.start(t, func(m *message.Message) ([]*message.Message, error) {
		ran <- handled{uuid: m.UUID, at: time.Now()}
		return nil, nil
	}, cfg)
	var order []string
	for range 3 {
		h := testwait.Receive(t, ran, "the three rows")
		order = append(order, h.uuid)
		if h.uuid != "other" {
			require.False(t, h.at.Before(due), "%s processed at %s, before %s", h.uuid, h.at, due)
		}
	}
	require.Equal(t, []string{"other", "late", "k-next"}, order)
}
