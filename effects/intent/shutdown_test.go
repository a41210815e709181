package intent_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/internal/fakeprovider"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// A sender stopped cleanly while its provider call is in flight gives the intent back at once:
// a restarted sender recovers it without waiting out the lease (2 minutes by default here),
// and the channel's policy decides about the send that may have happened. Here it did happen:
// the provider performed the effect and was still answering when the sender stopped.
func TestStopMidSendHandsTheIntentToThePolicyAtOnce(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, policy intent.CrashPolicy, lookup bool) (*fakeprovider.Provider, *intent.Sender, intent.Intent) {
		e := newEnv(t)
		provider := fakeprovider.Start(t)
		var p intent.Provider = newSMSProvider(t, provider)
		if lookup {
			p = lookupSMSProvider{p.(smsProvider)}
		}
		rec := e.record(t, "e-7")

		inCall, answer := make(chan struct{}), make(chan struct{})
		provider.OnSend(func(string) { close(inCall); <-answer })
		defer close(answer)
		stopping := e.sender(t, e.db, intent.Channel{Provider: p, OnCrash: policy}, intent.SenderConfig{})
		released := &stopping.TestSignals().Released
		released.Init()
		done := make(chan error, 1)
		go func() { done <- stopping.Run(context.Background()) }()
		<-inCall
		require.NoError(t, stopping.Close())
		require.NoError(t, <-done)
		require.Equal(t, intent.StatusSending, released.WaitOrTimeout().Status, "given back in doubt")
		provider.OnSend(nil)

		in := e.get(t, rec.Key)
		require.Equal(t, intent.StatusSending, in.Status, "a send in flight stays in doubt, never plain PENDING")
		require.Zero(t, in.Attempts, "stopping is not counted as an attempt")
		require.Contains(t, in.LastError, "sender stopped during the provider call")
		require.Equal(t, uint64(1), stopping.Counters().Released)
		require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+pgtx.QualifiedName(e.schema, "intents")+` WHERE lease_until <= now()`), "the lease is over")

		restarted := e.sender(t, e.db, intent.Channel{Provider: p, OnCrash: policy}, intent.SenderConfig{})
		n, err := restarted.SendOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, 1, n, "recovered at once, not after the lease")
		require.Equal(t, uint64(1), restarted.Counters().Recovered)
		return provider, restarted, e.get(t, rec.Key)
	}

	t.Run("reconcile finds the send and does not repeat it", func(t *testing.T) {
		t.Parallel()
		provider, s, in := run(t, intent.Reconcile, true)
		require.Equal(t, intent.StatusSent, in.Status)
		require.Equal(t, []string{in.Key}, provider.Keys(), "one call only")
		require.Equal(t, 1, provider.Lookups())
		require.Equal(t, uint64(1), s.Counters().Reconciled)
		require.Equal(t, 1, in.Attempts)
	})
	t.Run("resend repeats the key and the provider dedupes", func(t *testing.T) {
		t.Parallel()
		provider, _, in := run(t, intent.Resend, false)
		require.Equal(t, intent.StatusSent, in.Status)
		require.Equal(t, []string{in.Key, in.Key}, provider.Keys())
		require.Equal(t, 1, provider.Effects())
	})
	t.Run("skip parks it without calling again", func(t *testing.T) {
		t.Parallel()
		provider, s, in := run(t, intent.Skip, false)
		require.Equal(t, intent.StatusSkipped, in.Status)
		require.Equal(t, []string{in.Key}, provider.Keys())
		require.Equal(t, uint64(1), s.Counters().Skipped)
	})
}

// hangingLookup's Lookup waits for its context: the sender is stopped during it.
type hangingLookup struct {
	intent.Provider
	entered chan struct{}
}

func (p hangingLookup) Lookup(ctx context.Context, in intent.Intent) (string, bool, error) {
	close(p.entered)
	<-ctx.Done()
	return "", false, ctx.Err()
}

// Stopping during the reconcile lookup of an intent in doubt is not a failed lookup: the
// intent is neither counted nor parked (here its last attempt would have parked it as FAILED);
// it stays in doubt for the next sender, at once.
func TestStopDuringReconcileKeepsTheIntentInDoubt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	provider := fakeprovider.Start(t)
	rec := e.record(t, "e-8")
	// A sender crashed mid-call: SENDING, lease over.
	pgtest.Exec(t, e.db, `UPDATE `+pgtx.QualifiedName(e.schema, "intents")+` SET status = 'SENDING', attempts = 0,
    claim_token = gen_random_uuid(), lease_until = now() - interval '1 second'`)

	p := hangingLookup{Provider: newSMSProvider(t, provider), entered: make(chan struct{})}
	s := e.sender(t, e.db, intent.Channel{Provider: p, OnCrash: intent.Reconcile, MaxAttempts: 1}, intent.SenderConfig{})
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	<-p.entered
	require.NoError(t, s.Close())
	require.NoError(t, <-done)

	in := e.get(t, rec.Key)
	require.Equal(t, intent.StatusSending, in.Status)
	require.Zero(t, in.Attempts)
	require.Contains(t, in.LastError, "sender stopped during the reconcile lookup")
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+pgtx.QualifiedName(e.schema, "intents")+` WHERE lease_until <= now()`))
	require.Empty(t, provider.Keys(), "nothing was sent")
	require.Zero(t, s.Counters().Failed)
	require.Equal(t, uint64(1), s.Counters().Released)
}

// notSentOnStop's Send waits for its context and reports that nothing was sent.
type notSentOnStop struct{ entered chan struct{} }

func (p notSentOnStop) Send(ctx context.Context, in intent.Intent) (string, error) {
	close(p.entered)
	<-ctx.Done()
	return "", intent.NotSent(ctx.Err())
}

// A send that certainly did not happen (NotSent) when the sender stopped goes back to PENDING,
// due at once and not counted: nothing is in doubt.
func TestStopWithNothingSentGoesBackToPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rec := e.record(t, "e-9")
	p := notSentOnStop{entered: make(chan struct{})}
	s := e.sender(t, e.db, intent.Channel{Provider: p, OnCrash: intent.Skip}, intent.SenderConfig{})
	released := &s.TestSignals().Released
	released.Init()
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	<-p.entered
	require.NoError(t, s.Close())
	require.NoError(t, <-done)
	require.Equal(t, intent.StatusPending, released.WaitOrTimeout().Status, "given back as certainly not sent")

	in := e.get(t, rec.Key)
	require.Equal(t, intent.StatusPending, in.Status)
	require.Zero(t, in.Attempts)
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+pgtx.QualifiedName(e.schema, "intents")+` WHERE run_after <= now()`), "due at once")
	require.Equal(t, uint64(1), s.Counters().Released)
}
