package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// A worker stalls mid-handler; its lease expires; another processor re-claims the row and
// completes it. When the stalled worker resumes, its completion is refused by the claim token,
// its effects are rolled back with it, and the conflict is counted.
func TestStalledWorkerLosesLeaseAndLateCompletionIsRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	cfg := fast("c")
	cfg.Workers, cfg.Lease, cfg.RenewInterval, cfg.HandlerTimeout = 1, 300*time.Millisecond, -1, time.Minute

	entered := make(chan string, 2)
	resume := make(chan struct{})
	stalled := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if err := e.effect(m, "stalled"); err != nil {
			return nil, err
		}
		entered <- m.UUID
		<-resume
		if m.UUID == "fails-late" {
			return nil, errors.New("failure reported after the lease was lost")
		}
		return nil, nil
	}, cfg)

	require.NoError(t, r.Handle(msg("completes-late", "x")))
	require.Equal(t, "completes-late", <-entered)

	healthy := e.start(t, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "healthy") }, cfg)
	healthy.until(t, "the row to be re-claimed and completed", func(n tally) bool { return n.Done == 1 })

	resume <- struct{}{}
	stalled.until(t, "the late completion to be refused", func(n tally) bool { return n.LeaseLost == 1 })
	require.Zero(t, stalled.Counters().Processed)
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects")+` WHERE worker = 'healthy'`))
	row, err := e.ops.InspectMessage(context.Background(), "c", "completes-late")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusDone, row.Status)
	require.Equal(t, 2, row.Attempts, "the lost attempt counts")
	require.Contains(t, row.LastError, "lease expired during attempt 1")
	require.Positive(t, stalled.Counters().LeasesExpired+healthy.Counters().LeasesExpired)

	// The same for a stalled attempt that ends in an error: it must not touch the row either.
	require.NoError(t, healthy.Close())
	require.NoError(t, r.Handle(msg("fails-late", "x")))
	require.Equal(t, "fails-late", <-entered)
	other := e.start(t, func(m *message.Message) ([]*message.Message, error) { return nil, e.effect(m, "other") }, cfg)
	other.until(t, "the second row to be re-claimed", func(n tally) bool { return n.Done == 1 })
	close(resume)
	stalled.until(t, "the late failure to be refused", func(n tally) bool { return n.LeaseLost == 2 })
	require.Zero(t, stalled.Counters().Failed, "a failure reported without the lease is not recorded")
	row, err = e.ops.InspectMessage(context.Background(), "c", "fails-late")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusDone, row.Status)
	require.NotContains(t, row.LastError, "after the lease was lost")
	require.Equal(t, 2, e.effects(t))
}

// Close lets a running handler finish within the grace period and gives every other claimed
// row back, attempt uncounted.
func TestShutdownFinishesRunningHandlerAndReleasesTheRest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	for i := range 5 {
		require.NoError(t, r.Handle(msg(fmt.Sprintf("e-%d", i), "x")))
	}
	entered := make(chan struct{}, 5)
	finish := make(chan struct{})
	cfg := fast("c")
	cfg.Workers, cfg.BatchSize = 1, 10
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		entered <- struct{}{}
		<-finish
		return nil, e.effect(m, "w")
	}, cfg)
	<-entered
	require.Len(t, p.sig.Claimed.WaitOrTimeout(), 5, "one claim took all five")
	require.Equal(t, 5, e.status(t, "c", inbox.StatusInProgress))

	closed := make(chan struct{})
	go func() { _ = p.Close(); close(closed) }()
	p.until(t, "the unstarted rows to be released", func(n tally) bool { return n.Released == 4 })
	close(finish)
	<-closed
	require.Equal(t, uint64(1), p.Counters().Processed)
	require.Equal(t, 1, e.status(t, "c", inbox.StatusDone))
	require.Equal(t, 4, e.status(t, "c", inbox.StatusPending))
	require.Equal(t, 4, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")+` WHERE attempts = 0 AND claim_token IS NULL`))
	require.Len(t, entered, 0, "no other handler started after Close")
}

// A handler that runs longer than Lease keeps its row: its worker renews the lease every
// RenewInterval, so the reaper never takes the row back, and its completion is accepted as
// the row's first and only attempt.
func TestRenewalKeepsTheLeaseOfAHandlerRunningPastIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	cfg := fast("c")
	cfg.Workers, cfg.Lease, cfg.RenewInterval, cfg.HandlerTimeout = 1, 2*time.Second, 200*time.Millisecond, time.Minute
	entered := make(chan struct{})
	finish := make(chan struct{})
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		close(entered)
		<-finish
		return nil, e.effect(m, "w")
	}, cfg)
	require.NoError(t, r.Handle(msg("e-1", "x")))
	<-entered
	// Fifteen renewals, a tick of RenewInterval apart, span more than Lease; each must have
	// extended the row's lease.
	for i := range 15 {
		require.Equal(t, 1, p.sig.LeasesRenewed.WaitOrTimeout(), "renewal %d extended the lease", i+1)
	}
	close(finish)
	p.until(t, "the row to be completed", func(n tally) bool { return n.Done == 1 })
	require.Zero(t, p.settled.LeaseLost)
	require.Zero(t, p.Counters().LeasesExpired)
	row, err := e.ops.InspectMessage(context.Background(), "c", "e-1")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusDone, row.Status)
	require.Equal(t, 1, row.Attempts)
	require.Equal(t, 1, e.effects(t))
}
