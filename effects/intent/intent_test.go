package intent_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/idemkey"
	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/internal/fakeprovider"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// smsProvider is what a user writes for an HTTP provider: it relies on idemkey.Transport to
// send the intent key, and classifies the provider's answers.
type smsProvider struct {
	base   string
	client *http.Client
}

func newSMSProvider(t *testing.T, p *fakeprovider.Provider) smsProvider {
	tr, err := idemkey.NewTransport(p.Client().Transport, idemkey.TransportConfig{})
	require.NoError(t, err)
	return smsProvider{base: p.URL(), client: &http.Client{Transport: tr}}
}

func (p smsProvider) Send(ctx context.Context, in intent.Intent) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+"/send", bytes.NewReader(in.Payload))
	if err != nil {
		return "", wmonce.Permanent(err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return "", err // the request may have arrived: outcome unknown
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		return "", intent.NotSent(fmt.Errorf("provider answered %s", resp.Status))
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return "", wmonce.Permanent(fmt.Errorf("provider refused: %s", resp.Status))
	case resp.StatusCode >= 300:
		return "", fmt.Errorf("provider answered %s", resp.Status)
	}
	var r fakeprovider.Response
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return "", fmt.Errorf("provider answer: %w", err)
	}
	return r.ID, nil
}

// lookupSMSProvider can also find a send by our reference, which enables Reconcile.
type lookupSMSProvider struct{ smsProvider }

func (p lookupSMSProvider) Lookup(ctx context.Context, in intent.Intent) (string, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/lookup?reference="+url.QueryEscape(in.Key), nil)
	if err != nil {
		return "", false, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotFound:
		return "", false, nil
	case http.StatusOK:
		var r fakeprovider.Response
		err := json.NewDecoder(resp.Body).Decode(&r)
		return r.ID, err == nil, err
	}
	return "", false, fmt.Errorf("lookup answered %s", resp.Status)
}

type env struct {
	db     *sql.DB
	schema string
	store  *intent.Store
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	store, err := intent.NewStore(db, intent.StoreConfig{Schema: schema, Source: idemkey.Source{Consumer: "notifications"}})
	require.NoError(t, err)
	return &env{db: db, schema: schema, store: store}
}

// record records one sms intent for eventID in a committed transaction.
func (e *env) record(t *testing.T, eventID string) intent.Recorded {
	t.Helper()
	var rec intent.Recorded
	err := pgtx.RunInTx(context.Background(), e.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		rec, err = e.store.RecordTx(ctx, tx, intent.Draft{Channel: "sms", Consumer: "notifications", EventID: eventID, Payload: []byte(`{"to":"+919800000000","text":"Rs 2,400 cashback"}`)})
		return err
	})
	require.NoError(t, err)
	return rec
}

func (e *env) sender(t *testing.T, db *sql.DB, ch intent.Channel, cfg intent.SenderConfig) *intent.Sender {
	t.Helper()
	cfg.Schema = e.schema
	cfg.Channels = map[string]intent.Channel{"sms": ch}
	if cfg.Backoff == 0 {
		cfg.Backoff = time.Millisecond
	}
	s, err := intent.NewSender(db, cfg, watermill.NewStdLogger(false, false))
	require.NoError(t, err)
	return s
}

func (e *env) get(t *testing.T, key string) intent.Intent {
	t.Helper()
	in, err := e.store.Get(context.Background(), "sms", key)
	require.NoError(t, err)
	return in
}

func TestRecordInsideEffectivelyOnceHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mw, err := once.New(e.db, once.Config{Schema: e.schema, Consumer: "notifications"}, nil)
	require.NoError(t, err)
	fail := true
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		for _, ch := range []string{"sms", "email"} {
			if _, err := e.store.Record(msg, intent.Draft{Channel: ch, Payload: msg.Payload}); err != nil {
				return nil, err
			}
		}
		if fail {
			return nil, errors.New("handler fails after recording")
		}
		return nil, nil
	})
	count := func() int {
		return pgtest.Count(t, e.db, `SELECT count(*) FROM `+pgtx.QualifiedName(e.schema, "intents"))
	}

	_, err = h(message.NewMessage("e-91", []byte("cashback")))
	require.Error(t, err)
	require.Zero(t, count(), "a failed handler leaves no intent")

	fail = false
	for range 3 {
		_, err = h(message.NewMessage("e-91", []byte("cashback")))
		require.NoError(t, err)
	}
	require.Equal(t, 2, count(), "one intent per channel, however often the event arrives")

	key, _ := idemkey.Derive("notifications", "e-91", "sms")
	in := e.get(t, key)
	require.Equal(t, intent.StatusPending, in.Status)
	require.Equal(t, "e-91", in.EventID)
	require.Equal(t, []byte("cashback"), in.Payload)

	// Recording the same intent again in a new transaction is a reported no-op.
	rec := e.record(t, "e-91")
	require.Equal(t, key, rec.Key)
	require.False(t, rec.Created)

	// Outside the middleware there is no transaction to join: refused, not written around it.
	_, err = e.store.Record(message.NewMessage("e-92", nil), intent.Draft{Channel: "sms"})
	require.ErrorIs(t, err, pgtx.ErrNoTransaction)
	_, err = e.store.RecordTx(context.Background(), e.db, intent.Draft{Channel: "", Consumer: "c", EventID: "e"})
	require.ErrorContains(t, err, "channel is blank")
	_, err = e.store.RecordTx(context.Background(), e.db, intent.Draft{Channel: "s\x00ms", Consumer: "c", EventID: "e"})
	require.ErrorContains(t, err, "channel must not contain NUL bytes")
}

func TestSenderSendsWithTheIntentKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	provider := fakeprovider.Start(t)
	s := e.sender(t, e.db, intent.Channel{Provider: newSMSProvider(t, provider), OnCrash: intent.Resend}, intent.SenderConfig{})
	rec := e.record(t, "e-1")

	n, err := s.SendOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	in := e.get(t, rec.Key)
	require.Equal(t, intent.StatusSent, in.Status)
	require.Equal(t, 1, in.Attempts)
	require.False(t, in.SentAt.IsZero())
	id, _ := provider.SentID(rec.Key)
	require.Equal(t, id, in.ProviderID)
	require.Equal(t, []string{rec.Key}, provider.Keys(), "the provider received the intent key as Idempotency-Key")

	n, err = s.SendOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "a SENT intent is never taken again")
	require.Equal(t, intent.SenderCounters{Sent: 1}, s.Counters())
}

// Run's workers take what is ready, then wait: a round takes every ready intent once, and an
// intent it sent is not taken again.
func TestSenderRoundTakesEachReadyIntentOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	provider := fakeprovider.Start(t)
	for i := range 3 {
		e.record(t, fmt.Sprintf("e-%d", i))
	}
	s := e.sender(t, e.db, intent.Channel{Provider: newSMSProvider(t, provider), OnCrash: intent.Resend}, intent.SenderConfig{PollInterval: 5 * time.Millisecond})
	rounds := &s.TestSignals().RoundFinished
	rounds.Init()
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	require.Equal(t, 3, rounds.WaitOrTimeout(), "the first round takes the three intents")
	require.Zero(t, rounds.WaitOrTimeout(), "the next finds nothing: SENT intents are not taken again")
	require.NoError(t, s.Close())
	require.NoError(t, <-done)
	require.Equal(t, 3, provider.Effects())
}

func TestSenderRetriesThenParksFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	provider := fakeprovider.Start(t)
	provider.FailNext(2, http.StatusServiceUnavailable)
	s := e.sender(t, e.db, intent.Channel{Provider: newSMSProvider(t, provider), OnCrash: intent.Resend, MaxAttempts: 3}, intent.SenderConfig{PollInterval: 5 * time.Millisecond})
	sig := runSender(t, s)
	rec := e.record(t, "e-1")

	// Two 503s put it back with backoff; the third attempt goes through.
	sig.Sent.WaitFor(hasKey(rec.Key))
	in := e.get(t, rec.Key)
	require.Equal(t, intent.StatusSent, in.Status)
	require.Equal(t, 3, in.Attempts)
	require.Contains(t, in.LastError, "503", "the last failure stays visible")
	require.Equal(t, uint64(2), s.Counters().Retried)
	require.Equal(t, 1, provider.Effects())

	// A provider that keeps failing: after MaxAttempts the intent is FAILED, visibly.
	provider.FailNext(100, http.StatusServiceUnavailable)
	rec2 := e.record(t, "e-2")
	require.Equal(t, intent.StatusFailed, sig.Parked.WaitFor(hasKey(rec2.Key)).Status)
	in = e.get(t, rec2.Key)
	require.Equal(t, 3, in.Attempts)
	require.Contains(t, in.LastError, "gave up after 3 attempts")
	counts, err := e.store.Stats(context.Background())
	require.NoError(t, err)
	failed := findCount(counts, intent.StatusFailed)
	require.Equal(t, "sms", failed.Channel)
	require.Equal(t, int64(1), failed.Count, "the FAILED intent shows up where alerts look")
	require.Positive(t, failed.OldestAge)

	// An operator requeues it once the provider is back.
	provider.FailNext(0, 0)
	ok, err := e.store.Requeue(context.Background(), "sms", rec2.Key)
	require.NoError(t, err)
	require.True(t, ok)
	sig.Sent.WaitFor(hasKey(rec2.Key))
	ok, err = e.store.Requeue(context.Background(), "sms", rec2.Key)
	require.NoError(t, err)
	require.False(t, ok, "a SENT intent is not requeued")
}

func findCount(counts []intent.ChannelStats, st intent.Status) intent.ChannelStats {
	for _, c := range counts {
		if c.Status == st {
			return c
		}
	}
	return intent.ChannelStats{}
}

func TestSenderParksRejectedIntentAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	provider := fakeprovider.Start(t)
	provider.FailNext(1, http.StatusBadRequest)
	s := e.sender(t, e.db, intent.Channel{Provider: newSMSProvider(t, provider), OnCrash: intent.Resend}, intent.SenderConfig{})
	rec := e.record(t, "e-1")
	_, err := s.SendOnce(context.Background())
	require.NoError(t, err)
	in := e.get(t, rec.Key)
	require.Equal(t, intent.StatusFailed, in.Status)
	require.Equal(t, 1, in.Attempts)
	require.Contains(t, in.LastError, "rejected by the provider")
}

// runSender runs s in the background until the test ends and returns its test signals, the
// intent events initialised before it starts.
func runSender(t *testing.T, s *intent.Sender) *intent.SenderTestSignals {
	t.Helper()
	sig := s.TestSignals()
	sig.Sent.Init()
	sig.Parked.Init()
	sig.Released.Init()
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, s.Close())
		require.NoError(t, <-done)
	})
	return sig
}

// hasKey matches the event of the intent with key.
func hasKey(key string) func(intent.Intent) bool {
	return func(in intent.Intent) bool { return in.Key == key }
}

// crash makes a sender die at a chosen point: its own pool is closed, so it can no longer
// record anything, exactly like a process that stopped.
type crash struct {
	db   *sql.DB
	once sync.Once
}

func (c *crash) now() { c.once.Do(func() { _ = c.db.Close() }) }

// crashBeforeCall wraps a provider: the sender dies after claiming, before the call.
type crashBeforeCall struct {
	intent.Provider
	crash *crash
}

func (p crashBeforeCall) Send(ctx context.Context, in intent.Intent) (string, error) {
	p.crash.now()
	return "", errors.New("process died before the call")
}

func TestCrashInSending(t *testing.T) {
	t.Parallel()
	const lease = 400 * time.Millisecond
	cfg := intent.SenderConfig{Lease: lease, SendTimeout: lease / 2, PollInterval: 10 * time.Millisecond}

	// run records one intent, lets a sender crash on it at the chosen point, then lets a healthy
	// sender recover it once the lease has run out.
	run := func(t *testing.T, policy intent.CrashPolicy, lookup bool, beforeCall bool) (*fakeprovider.Provider, *intent.Sender, intent.Intent) {
		e := newEnv(t)
		provider := fakeprovider.Start(t)
		var p intent.Provider = newSMSProvider(t, provider)
		if lookup {
			p = lookupSMSProvider{p.(smsProvider)}
		}
		c := &crash{db: pgtest.OpenDB(t, 2)}
		crashing := p
		if beforeCall {
			crashing = crashBeforeCall{Provider: p, crash: c}
		} else {
			provider.OnSend(func(string) { c.now() }) // the effect happened; the answer never gets recorded
		}
		rec := e.record(t, "e-91")

		dying := e.sender(t, c.db, intent.Channel{Provider: crashing, OnCrash: intent.Resend}, cfg)
		_, err := dying.SendOnce(context.Background())
		require.ErrorContains(t, err, "database is closed", "the dying sender could not record the outcome")
		provider.OnSend(nil)
		require.Equal(t, intent.StatusSending, e.get(t, rec.Key).Status, "the crash leaves the intent in SENDING")

		// The healthy sender takes the intent once the lease has run out, and settles it.
		healthy := e.sender(t, e.db, intent.Channel{Provider: p, OnCrash: policy}, cfg)
		sig := runSender(t, healthy)
		if policy == intent.Skip {
			sig.Parked.WaitFor(hasKey(rec.Key))
		} else {
			sig.Sent.WaitFor(hasKey(rec.Key))
		}
		require.Equal(t, uint64(1), healthy.Counters().Recovered)
		return provider, healthy, e.get(t, rec.Key)
	}

	t.Run("reconcile finds the send and does not repeat it", func(t *testing.T) {
		t.Parallel()
		provider, s, in := run(t, intent.Reconcile, true, false)
		require.Equal(t, intent.StatusSent, in.Status)
		id, _ := provider.SentID(in.Key)
		require.Equal(t, id, in.ProviderID)
		require.Equal(t, []string{in.Key}, provider.Keys(), "one call only")
		require.Equal(t, 1, provider.Lookups())
		require.Equal(t, uint64(1), s.Counters().Reconciled)
	})
	t.Run("reconcile sends what never reached the provider", func(t *testing.T) {
		t.Parallel()
		provider, s, in := run(t, intent.Reconcile, true, true)
		require.Equal(t, intent.StatusSent, in.Status)
		require.Equal(t, []string{in.Key}, provider.Keys())
		require.Equal(t, 1, provider.Effects())
		require.Zero(t, s.Counters().Reconciled)
	})
	t.Run("resend repeats the key and the provider dedupes", func(t *testing.T) {
		t.Parallel()
		provider, _, in := run(t, intent.Resend, false, false)
		require.Equal(t, intent.StatusSent, in.Status)
		require.Equal(t, []string{in.Key, in.Key}, provider.Keys(), "the provider saw the same key twice")
		require.Equal(t, 1, provider.Effects(), "and performed the effect once")
		id, _ := provider.SentID(in.Key)
		require.Equal(t, id, in.ProviderID)
		require.Equal(t, 2, in.Attempts)
	})
	t.Run("skip parks it visibly without calling again", func(t *testing.T) {
		t.Parallel()
		provider, s, in := run(t, intent.Skip, false, false)
		require.Equal(t, intent.StatusSkipped, in.Status)
		require.Contains(t, in.LastError, "skipped by policy")
		require.Equal(t, []string{in.Key}, provider.Keys())
		require.Equal(t, uint64(1), s.Counters().Skipped)
	})
}

func TestUnknownOutcomeFollowsPolicy(t *testing.T) {
	t.Parallel()
	// A provider that performs the effect but whose answer is lost: Send returns a plain error.
	t.Run("reconcile looks it up instead of resending", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		provider := fakeprovider.Start(t)
		p := lookupSMSProvider{newSMSProvider(t, provider)}
		s := e.sender(t, e.db, intent.Channel{Provider: lostAnswer{p}}, intent.SenderConfig{PollInterval: 5 * time.Millisecond})
		sig := runSender(t, s)
		rec := e.record(t, "e-1")
		sig.Sent.WaitFor(hasKey(rec.Key))
		require.Equal(t, intent.StatusSent, e.get(t, rec.Key).Status)
		st := s.Counters()
		require.Equal(t, uint64(1), st.Unknown)
		require.Equal(t, uint64(1), st.Reconciled)
		require.Equal(t, 1, provider.Effects())
		require.Len(t, provider.Keys(), 1, "sent once, then looked up")
	})
	t.Run("skip parks it", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		provider := fakeprovider.Start(t)
		s := e.sender(t, e.db, intent.Channel{Provider: lostAnswer{newSMSProvider(t, provider)}, OnCrash: intent.Skip}, intent.SenderConfig{})
		rec := e.record(t, "e-1")
		_, err := s.SendOnce(context.Background())
		require.NoError(t, err)
		require.Equal(t, intent.StatusSkipped, e.get(t, rec.Key).Status)
	})
}

// lostAnswer performs the send but reports a failure, like a timeout after the request arrived.
type lostAnswer struct{ intent.Provider }

func (p lostAnswer) Send(ctx context.Context, in intent.Intent) (string, error) {
	if _, err := p.Provider.Send(ctx, in); err != nil {
		return "", err
	}
	return "", errors.New("read: connection reset by peer")
}

func (p lostAnswer) Lookup(ctx context.Context, in intent.Intent) (string, bool, error) {
	l, ok := p.Provider.(intent.Lookuper)
	if !ok {
		return "", false, errors.New("no lookup")
	}
	return l.Lookup(ctx, in)
}

func TestConcurrentSendersSendEachIntentOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	provider := fakeprovider.Start(t)
	provider.IgnoreKeys() // every call is an effect: a double claim would show as an extra effect
	const intents = 40
	for i := range intents {
		e.record(t, fmt.Sprintf("e-%d", i))
	}
	ch := intent.Channel{Provider: newSMSProvider(t, provider), OnCrash: intent.Resend}
	a := e.sender(t, e.db, ch, intent.SenderConfig{Workers: 3, PollInterval: 10 * time.Millisecond})
	b := e.sender(t, e.db, ch, intent.SenderConfig{Workers: 3, PollInterval: 10 * time.Millisecond})
	aSent, bSent := runSender(t, a).Sent.C(), runSender(t, b).Sent.C()
	for sent := 0; sent < intents; sent++ {
		select {
		case <-aSent:
		case <-bSent:
		case <-time.After(testsignal.Timeout):
			t.Fatalf("%d of %d intents sent within %s", sent, intents, testsignal.Timeout)
		}
	}
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.Equal(t, intents, pgtest.Count(t, e.db, `SELECT count(*) FROM `+pgtx.QualifiedName(e.schema, "intents")+` WHERE status = 'SENT'`))
	require.Equal(t, intents, provider.Effects(), "each intent sent exactly once across six workers")
	require.Equal(t, uint64(intents), a.Counters().Sent+b.Counters().Sent)
}

func TestSenderConfigValidation(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	p := smsProvider{}
	for name, c := range map[string]struct {
		cfg  intent.SenderConfig
		want string // the field or rule the error must name
	}{
		"no channels":              {intent.SenderConfig{}, "Channels is empty"},
		"nil provider":             {intent.SenderConfig{Channels: map[string]intent.Channel{"sms": {OnCrash: intent.Resend}}}, `channel "sms": Provider is nil`},
		"policy must be chosen":    {intent.SenderConfig{Channels: map[string]intent.Channel{"sms": {Provider: p}}}, "choose OnCrash"},
		"reconcile without lookup": {intent.SenderConfig{Channels: map[string]intent.Channel{"sms": {Provider: p, OnCrash: intent.Reconcile}}}, "OnCrash is Reconcile"},
		"unknown policy":           {intent.SenderConfig{Channels: map[string]intent.Channel{"sms": {Provider: p, OnCrash: 9}}}, "unknown OnCrash CrashPolicy(9)"},
		"timeout above lease":      {intent.SenderConfig{Channels: map[string]intent.Channel{"sms": {Provider: p, OnCrash: intent.Skip}}, Lease: time.Second, SendTimeout: 2 * time.Second}, "SendTimeout (2s) must be below Lease (1s)"},
		"negative backoff":         {intent.SenderConfig{Channels: map[string]intent.Channel{"sms": {Provider: p, OnCrash: intent.Skip}}, Backoff: -time.Second}, "Backoff must be positive"},
		"max backoff below":        {intent.SenderConfig{Channels: map[string]intent.Channel{"sms": {Provider: p, OnCrash: intent.Skip}}, Backoff: time.Minute, MaxBackoff: time.Second}, "MaxBackoff must be at least 1m0s"},
		"bad schema":               {intent.SenderConfig{Schema: "Bad-Schema", Channels: map[string]intent.Channel{"sms": {Provider: p, OnCrash: intent.Skip}}}, "schema"},
		"bad attempts":             {intent.SenderConfig{Channels: map[string]intent.Channel{"sms": {Provider: p, OnCrash: intent.Skip, MaxAttempts: -1}}}, `channel "sms": MaxAttempts must be at least 1`},
		"blank channel":            {intent.SenderConfig{Channels: map[string]intent.Channel{" ": {Provider: p, OnCrash: intent.Skip}}}, `channel " ": channel is blank`},
	} {
		_, err := intent.NewSender(db, c.cfg, nil)
		require.ErrorContains(t, err, "invalid sender config", name)
		require.ErrorContains(t, err, c.want, name)
	}
	_, err := intent.NewSender(db, intent.SenderConfig{Channels: map[string]intent.Channel{"sms": {Provider: p}}}, nil)
	require.ErrorContains(t, err, "choose OnCrash: Resend")
	// A Lookuper gets Reconcile by default.
	_, err = intent.NewSender(db, intent.SenderConfig{Channels: map[string]intent.Channel{"sms": {Provider: lookupSMSProvider{p}}}}, nil)
	require.NoError(t, err)
	_, err = intent.NewSender(nil, intent.SenderConfig{}, nil)
	require.ErrorContains(t, err, "db is nil")
}

func TestBacklogCountsUnfinishedIntentsPerChannel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	provider := fakeprovider.Start(t)
	s := e.sender(t, e.db, intent.Channel{Provider: newSMSProvider(t, provider), OnCrash: intent.Resend, MaxAttempts: 1},
		intent.SenderConfig{Backoff: time.Hour})
	require.Equal(t, []string{"sms"}, s.Channels())

	backlog, err := e.store.Backlog(ctx)
	require.NoError(t, err)
	require.Empty(t, backlog)

	sent := e.record(t, "e-1")
	_, err = s.SendOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, intent.StatusSent, e.get(t, sent.Key).Status)
	provider.FailNext(1, http.StatusBadRequest)
	failed := e.record(t, "e-2")
	_, err = s.SendOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, intent.StatusFailed, e.get(t, failed.Key).Status)
	pending := e.record(t, "e-3")
	e.record(t, "e-4")
	table := pgtx.QualifiedName(e.schema, "intents")
	pgtest.Exec(t, e.db, `UPDATE `+table+` SET created_at = now() - interval '90 seconds', attempts = 1 WHERE intent_key = $1`, pending.Key)
	sending := e.record(t, "e-5")
	pgtest.Exec(t, e.db, `UPDATE `+table+` SET status = 'SENDING', claim_token = gen_random_uuid(), lease_until = now() + interval '1 hour',
    created_at = now() - interval '30 seconds' WHERE intent_key = $1`, sending.Key)
	_, err = e.store.RecordTx(ctx, e.db, intent.Draft{Channel: "email", Consumer: "c", EventID: "e-6"})
	require.NoError(t, err)
	pgtest.Exec(t, e.db, `UPDATE `+table+` SET status = 'SKIPPED' WHERE channel = 'email'`)

	backlog, err = e.store.Backlog(ctx)
	require.NoError(t, err)
	sms := backlog["sms"]
	require.Equal(t, int64(2), sms.Pending)
	require.Equal(t, int64(1), sms.Retrying, "the pending intent a sender took before")
	require.Equal(t, int64(1), sms.Sending)
	require.Equal(t, int64(1), sms.Failed)
	require.Zero(t, sms.Skipped)
	require.InDelta(t, 90, sms.OldestPendingAge.Seconds(), 30)
	require.InDelta(t, 30, sms.OldestSendingAge.Seconds(), 30)
	require.Equal(t, intent.Backlog{Skipped: 1}, backlog["email"])
	require.Len(t, backlog, 2, "SENT intents are not part of the backlog")
}

// The Run/Close rules of every worker (internal/worker.Runner): one Run at a time, Run again
// after it returned, Close final.
func TestSenderRunAgainAfterItReturnedAndCloseIsFinal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	provider := fakeprovider.Start(t)
	s := e.sender(t, e.db, intent.Channel{Provider: newSMSProvider(t, provider), OnCrash: intent.Resend}, intent.SenderConfig{PollInterval: 5 * time.Millisecond})

	sent := &s.TestSignals().Sent
	sent.Init()
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- s.Run(ctx) }()
	e.record(t, "e-1")
	sent.WaitOrTimeout()
	require.ErrorContains(t, s.Run(context.Background()), "already running")
	cancel()
	require.NoError(t, <-first)

	second := make(chan error, 1)
	go func() { second <- s.Run(context.Background()) }()
	e.record(t, "e-2")
	sent.WaitOrTimeout()
	require.Equal(t, uint64(2), s.Counters().Sent)
	require.NoError(t, s.Close())
	require.NoError(t, <-second, "Close stopped the second Run and waited for it")
	require.NoError(t, s.Run(context.Background()), "Run after Close returns at once")
}
