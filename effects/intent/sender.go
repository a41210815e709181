package intent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/idemkey"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// Provider performs the external effect of an intent.
//
// Send is called with in.Key in the context (idemkey.WithKey), so an HTTP provider built on
// idemkey.Transport sends it as Idempotency-Key without further code; other providers should
// pass in.Key as their idempotency key or client reference. Send returns the provider's id of
// the effect (message id, charge id) on success. Errors say what is known about the effect:
//
//   - wmonce.Permanent(err): the provider refused it and nothing happened (bad number,
//     invalid request). The intent becomes FAILED at once.
//   - NotSent(err): nothing happened and trying again may work (HTTP 429 or 503 before
//     processing, connection refused). The intent goes back to PENDING with backoff.
//   - any other error: the outcome is unknown (a timeout, a connection dropped after the
//     request was written). The channel's CrashPolicy decides, as for a crash in SENDING.
type Provider interface {
	Send(ctx context.Context, in Intent) (providerID string, err error)
}

// Lookuper is implemented by providers that can look up an effect by our reference (the
// intent key). It enables the Reconcile policy.
type Lookuper interface {
	// Lookup reports whether the provider performed the effect for in.Key, and its id.
	// found=false must mean "definitely not performed": it leads to a send.
	Lookup(ctx context.Context, in Intent) (providerID string, found bool, err error)
}

// NotSent marks a Send error after which the provider certainly did not perform the effect,
// so the intent is simply retried.
func NotSent(err error) error {
	if err == nil {
		return nil
	}
	return &notSentError{err}
}

type notSentError struct{ err error }

func (e *notSentError) Error() string { return "not sent: " + e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// IsNotSent reports whether err was marked with NotSent.
func IsNotSent(err error) bool {
	var n *notSentError
	return errors.As(err, &n)
}

// CrashPolicy says what a sender does with an intent whose outcome is unknown: one found in
// SENDING after its lease ran out (the sender crashed mid-call), or one whose Send returned an
// error that is neither Permanent nor NotSent.
type CrashPolicy int

const (
	// PolicyDefault is Reconcile for providers that implement Lookuper; for others it is a
	// configuration error, so that the trade-off is chosen, not inherited.
	PolicyDefault CrashPolicy = iota
	// Reconcile looks the reference up at the provider: found means SENT without sending;
	// not found means send again with the same key. Requires a Lookuper.
	Reconcile
	// Resend sends again with the same idempotency key. No duplicate if the provider honours
	// the key; otherwise a duplicate is possible, never a gap.
	Resend
	// Skip marks the intent SKIPPED and logs an error: never a duplicate, possibly a gap.
	Skip
)

func (p CrashPolicy) String() string {
	switch p {
	case PolicyDefault:
		return "default"
	case Reconcile:
		return "reconcile"
	case Resend:
		return "resend"
	case Skip:
		return "skip"
	}
	return fmt.Sprintf("CrashPolicy(%d)", int(p))
}

// Channel configures one channel of a Sender.
type Channel struct {
	// Provider performs the effect. Required.
	Provider Provider
	// OnCrash decides about intents whose outcome is unknown. See CrashPolicy.
	OnCrash CrashPolicy
	// MaxAttempts is how often a sender may take an intent before it becomes FAILED. Default 5.
	MaxAttempts int
}

// SenderConfig configures a Sender.
type SenderConfig struct {
	// Schema holds the intents table. Default pgtx.DefaultSchema.
	Schema string
	// Channels maps channel names to their providers and policies. Intents of channels not
	// listed here are left alone (another Sender may own them). At least one is required.
	Channels map[string]Channel
	// Workers is the number of intents sent at once by Run. Default 1. Each holds a database
	// connection only for the short claim and finish statements, not during the provider call.
	Workers int
	// Lease is how long a claimed intent stays SENDING before other senders take it for
	// crashed. Default 2 minutes. A sender that stops cleanly ends the lease of its intent at
	// once (see Sender.Close).
	Lease time.Duration
	// SendTimeout bounds each Send and Lookup. It must be below Lease. Default 30 seconds.
	SendTimeout time.Duration
	// PollInterval is the wait after finding nothing to send. Default 1 second.
	PollInterval time.Duration
	// Backoff is the delay before the second attempt of an intent, and the first wait after a
	// database error; it doubles per attempt up to MaxBackoff, each delay drawn between half and
	// all of that value (jitter). Defaults 1 second and 5 minutes.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// TracerProvider traces every take of an intent: an "intent send" span (kind client) with
	// the channel, the intent key, the attempt and the state reached; the provider is called
	// with it in the context. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func (c *SenderConfig) setDefaults() {
	if c.Schema == "" {
		c.Schema = pgtx.DefaultSchema
	}
	if c.Workers == 0 {
		c.Workers = 1
	}
	if c.Lease == 0 {
		c.Lease = 2 * time.Minute
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = min(30*time.Second, c.Lease/2)
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.Backoff == 0 {
		c.Backoff = time.Second
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(5*time.Minute, c.Backoff)
	}
	for name, ch := range c.Channels {
		if ch.MaxAttempts == 0 {
			ch.MaxAttempts = 5
		}
		if ch.OnCrash == PolicyDefault {
			if _, ok := ch.Provider.(Lookuper); ok {
				ch.OnCrash = Reconcile
			}
		}
		c.Channels[name] = ch
	}
}

// Validate reports what to fix in a configuration.
func (c SenderConfig) Validate() error {
	var errs []error
	if err := pgtx.ValidateIdentifier("schema", c.Schema); err != nil {
		errs = append(errs, err)
	}
	if len(c.Channels) == 0 {
		errs = append(errs, errors.New("Channels is empty: configure at least one channel with its Provider"))
	}
	names := make([]string, 0, len(c.Channels))
	for name := range c.Channels {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		ch := c.Channels[name]
		if err := validateChannel(name); err != nil {
			errs = append(errs, fmt.Errorf("channel %q: %w", name, err))
		}
		if ch.Provider == nil {
			errs = append(errs, fmt.Errorf("channel %q: Provider is nil", name))
			continue
		}
		_, canLookup := ch.Provider.(Lookuper)
		switch ch.OnCrash {
		case PolicyDefault:
			errs = append(errs, fmt.Errorf("channel %q: its provider cannot look sends up (it does not implement intent.Lookuper), so choose OnCrash: Resend (a crash mid-call may send twice unless the provider honours the idempotency key) or Skip (a crash mid-call may lose the send)", name))
		case Reconcile:
			if !canLookup {
				errs = append(errs, fmt.Errorf("channel %q: OnCrash is Reconcile but the provider does not implement intent.Lookuper; implement Lookup or choose Resend or Skip", name))
			}
		case Resend, Skip:
		default:
			errs = append(errs, fmt.Errorf("channel %q: unknown OnCrash %v", name, ch.OnCrash))
		}
		if ch.MaxAttempts < 1 {
			errs = append(errs, fmt.Errorf("channel %q: MaxAttempts must be at least 1, got %d", name, ch.MaxAttempts))
		}
	}
	if c.Workers < 1 || c.Workers > 1024 {
		errs = append(errs, fmt.Errorf("Workers must be between 1 and 1024, got %d", c.Workers))
	}
	if c.Lease <= 0 || c.SendTimeout <= 0 || c.PollInterval <= 0 || c.Backoff <= 0 || c.MaxBackoff < c.Backoff {
		errs = append(errs, errors.New("Lease, SendTimeout, PollInterval and Backoff must be positive and MaxBackoff >= Backoff"))
	} else if c.SendTimeout >= c.Lease {
		errs = append(errs, fmt.Errorf("SendTimeout (%s) must be below Lease (%s): otherwise a slow but live sender is taken for crashed and its intent is sent twice", c.SendTimeout, c.Lease))
	}
	return errors.Join(errs...)
}

// SenderCounters are a Sender's running totals.
type SenderCounters struct {
	Sent       uint64 // intents the provider confirmed
	Retried    uint64 // sends that failed with NotSent and were put back with backoff
	Unknown    uint64 // sends with an unknown outcome, handed to the channel's policy
	Failed     uint64 // intents parked as FAILED
	Skipped    uint64 // intents parked as SKIPPED
	Recovered  uint64 // intents found in SENDING after their lease ran out
	Reconciled uint64 // recovered intents the provider's lookup confirmed (not sent again)
	LeaseLost  uint64 // outcomes not recorded because another sender had taken the intent over
	Released   uint64 // intents given back at shutdown (see Sender.Close)
	Errors     uint64 // database errors (retried)
}

// Sender moves intents from PENDING to SENT through the channels' providers. See the package
// documentation for the state machine and its guarantees. Any number of Senders may run on one
// table: claims use FOR UPDATE SKIP LOCKED and every state change is fenced by a claim token.
type Sender struct {
	db       *sql.DB
	config   SenderConfig
	logger   watermill.LoggerAdapter
	tracer   trace.Tracer
	channels []string

	qClaimPending, qClaimStuck       string
	qSent, qPending, qPark, qUnknown string
	qReleaseInDoubt, qReleaseNotSent string

	sent, retried, unknown, failed, skipped, recovered, reconciled, leaseLost, released, errs atomic.Uint64

	life worker.Runner
}

// NewSender validates config and returns a Sender. It does not touch the database.
func NewSender(db *sql.DB, config SenderConfig, logger watermill.LoggerAdapter) (*Sender, error) {
	channels := make(map[string]Channel, len(config.Channels))
	for k, v := range config.Channels {
		channels[k] = v
	}
	config.Channels = channels // setDefaults fills in the copy, not the caller's map
	logger, err := setup.Component(db, "intent: db is nil: open one with pgtx.Open", &config, (*SenderConfig).setDefaults, "intent: invalid sender config", logger)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(channels))
	for name := range channels {
		names = append(names, name)
	}
	sort.Strings(names)
	t := pgtx.QualifiedName(config.Schema, "intents")
	returning := ` RETURNING i.id, i.channel, i.intent_key, i.consumer, i.event_id, i.step, i.payload, i.status,
    i.attempts, coalesce(i.provider_id, ''), coalesce(i.last_error, ''), i.created_at, i.updated_at, i.sent_at,
    i.claim_token::text, coalesce(i.trace_parent, ''), coalesce(i.trace_state, '')`
	return &Sender{
		db:       db,
		config:   config,
		logger:   logger,
		tracer:   tracing.Tracer(config.TracerProvider),
		channels: names,
		qClaimPending: `WITH c AS (
    SELECT id FROM ` + t + ` WHERE status = 'PENDING' AND channel = ANY($1) AND run_after <= now()
    ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE ` + t + ` i SET status = 'SENDING', attempts = i.attempts + 1, claim_token = gen_random_uuid(),
    lease_until = now() + $2 * interval '1 microsecond', updated_at = now()
FROM c WHERE i.id = c.id` + returning,
		qClaimStuck: `WITH c AS (
    SELECT id FROM ` + t + ` WHERE status = 'SENDING' AND channel = ANY($1) AND lease_until < now()
    ORDER BY lease_until LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE ` + t + ` i SET attempts = i.attempts + 1, claim_token = gen_random_uuid(),
    lease_until = now() + $2 * interval '1 microsecond', updated_at = now()
FROM c WHERE i.id = c.id` + returning,
		qSent: `UPDATE ` + t + ` SET status = 'SENT', provider_id = $3, sent_at = now(), claim_token = NULL,
    lease_until = NULL, updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
		qPending: `UPDATE ` + t + ` SET status = 'PENDING', run_after = now() + $3 * interval '1 microsecond',
    last_error = $4, claim_token = NULL, lease_until = NULL, updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
		qPark: `UPDATE ` + t + ` SET status = $3, last_error = $4, claim_token = NULL, lease_until = NULL, updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
		// Outcome unknown on a Reconcile channel: stay SENDING under a token nobody holds, so
		// that once the backoff has passed the row is recovered like a crash and looked up first.
		qUnknown: `UPDATE ` + t + ` SET lease_until = now() + $3 * interval '1 microsecond', last_error = $4,
    claim_token = gen_random_uuid(), updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
		// Shutdown with the outcome in doubt (a send in flight, or an intent recovered from
		// SENDING and not settled yet): stay SENDING under a token nobody holds with the lease
		// already over, so that the next sender recovers it at once and applies the channel's
		// policy. The attempt is not counted: stopping was not the intent's doing.
		qReleaseInDoubt: `UPDATE ` + t + ` SET lease_until = now(), last_error = $3, claim_token = gen_random_uuid(),
    attempts = greatest(attempts - 1, 0), updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
		// Shutdown before the provider was called (or it answered NotSent): certainly not sent,
		// so simply PENDING again, due at once, the attempt not counted.
		qReleaseNotSent: `UPDATE ` + t + ` SET status = 'PENDING', run_after = now(), claim_token = NULL, lease_until = NULL,
    attempts = greatest(attempts - 1, 0), updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
	}, nil
}

// Counters returns the running totals.
func (s *Sender) Counters() SenderCounters {
	return SenderCounters{
		Sent: s.sent.Load(), Retried: s.retried.Load(), Unknown: s.unknown.Load(), Failed: s.failed.Load(),
		Skipped: s.skipped.Load(), Recovered: s.recovered.Load(), Reconciled: s.reconciled.Load(),
		LeaseLost: s.leaseLost.Load(), Released: s.released.Load(), Errors: s.errs.Load(),
	}
}

// Channels returns the names of the channels this Sender works, sorted.
func (s *Sender) Channels() []string { return slices.Clone(s.channels) }

// Close stops Run and waits for it to return. It is idempotent and final: a Run after Close
// returns nil at once.
//
// Stopping (Close, or cancelling the context of Run or SendNext) cancels the provider call in
// flight and gives back the intent being worked, so that a restarted sender need not wait out
// Lease:
//   - not sent yet (stopped before the call, or the provider answered NotSent): PENDING again,
//     due at once;
//   - in doubt (the call was under way and its answer is neither a success, NotSent nor
//     Permanent; or an intent recovered from SENDING was not settled yet): it stays SENDING
//     with its lease ended, and the next sender recovers it at once through the channel's
//     CrashPolicy, exactly as after a crash. Stopping never turns "maybe sent" into a plain
//     resend: Reconcile looks it up first, Skip parks it, and only Resend sends it again;
//   - a known outcome (a success, a Permanent rejection) is recorded as usual.
//
// The attempt is not counted in either case of giving back. If the database cannot be
// reached to record this, the intent waits out its lease as after a crash.
func (s *Sender) Close() error { return s.life.Close() }

// Run sends intents with config.Workers workers until ctx is cancelled or Close is called. It
// returns nil on a clean stop. Database errors are logged and retried; provider errors are
// recorded on the intent. One Run at a time: a second concurrent Run returns an error; Run may
// be called again after it returned.
func (s *Sender) Run(ctx context.Context) error {
	return s.life.Run(ctx, func(ctx context.Context) error {
		var wg sync.WaitGroup
		for range s.config.Workers {
			wg.Go(func() { s.work(ctx) })
		}
		wg.Wait()
		return nil
	})
}

func (s *Sender) work(ctx context.Context) {
	backoff := worker.Backoff{Base: s.config.Backoff, Max: s.config.MaxBackoff}
	for ctx.Err() == nil {
		did, err := s.SendNext(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			wait := backoff.Next()
			s.logger.Error("Intent sender database error, retrying", err, watermill.LogFields{"backoff": wait})
			if !worker.Sleep(ctx, wait) {
				return
			}
		case !did:
			backoff.Reset()
			if !worker.Sleep(ctx, s.config.PollInterval) {
				return
			}
		default:
			backoff.Reset()
		}
	}
}

// SendOnce works intents one after another until none is ready, and returns how many it took.
// It is meant for tests, the CLI and callers with their own scheduling; it may run beside Run.
func (s *Sender) SendOnce(ctx context.Context) (int, error) {
	n := 0
	for {
		did, err := s.SendNext(ctx)
		if err != nil || !did {
			return n, err
		}
		n++
	}
}

// SendNext takes at most one intent: first one whose lease ran out in SENDING, otherwise the
// oldest ready PENDING one, and carries it to its next state. It reports whether it found one.
// The error is about the database; provider errors are recorded on the intent.
func (s *Sender) SendNext(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	in, token, err := s.claim(ctx, s.qClaimStuck)
	if err != nil {
		return false, err
	}
	recovered := in != nil
	if !recovered {
		if in, token, err = s.claim(ctx, s.qClaimPending); err != nil || in == nil {
			return false, err
		}
	}
	return true, s.process(ctx, *in, token, recovered)
}

// claim runs a claim statement. It is not cancelled with ctx: an intent claimed by a
// statement whose reply is lost would sit in SENDING until its lease ran out.
func (s *Sender) claim(ctx context.Context, query string) (*Intent, string, error) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.config.SendTimeout)
	defer cancel()
	row := s.db.QueryRowContext(qctx, query, s.channels, s.config.Lease.Microseconds())
	var in Intent
	var status, token string
	var sentAt sql.NullTime
	err := row.Scan(&in.ID, &in.Channel, &in.Key, &in.Consumer, &in.EventID, &in.Step, &in.Payload, &status,
		&in.Attempts, &in.ProviderID, &in.LastError, &in.CreatedAt, &in.UpdatedAt, &sentAt, &token, &in.TraceParent, &in.TraceState)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, "", nil
	}
	if err != nil {
		s.errs.Add(1)
		if pgtx.IsUndefinedTable(err) {
			return nil, "", fmt.Errorf("intent: the intents table is missing in schema %q: run the migrations: %w", s.config.Schema, err)
		}
		return nil, "", fmt.Errorf("intent: claim: %w", err)
	}
	in.Status = Status(status)
	return &in, token, nil
}

func (s *Sender) process(ctx context.Context, in Intent, token string, recovered bool) (err error) {
	ctx, span := s.startSpan(ctx, in, recovered)
	defer func() { tracing.End(span, err) }()
	ch := s.config.Channels[in.Channel]
	fields := watermill.LogFields{"intent_id": in.ID, "channel": in.Channel, "intent_key": in.Key, "event_id": in.EventID, "attempt": in.Attempts}
	if ctx.Err() != nil {
		return s.release(ctx, in, token, recovered, "sender stopped before working it", fields)
	}
	if recovered {
		s.recovered.Add(1)
		s.logger.Info("Intent found in SENDING after its lease ran out; applying the channel's crash policy", fields.Add(watermill.LogFields{"policy": ch.OnCrash.String(), "last_error": in.LastError}))
		switch ch.OnCrash {
		case Skip:
			return s.park(ctx, in, token, StatusSkipped, "outcome unknown (sender crashed or the call failed mid-flight); skipped by policy: the effect happened once or not at all. Requeue to send it anyway", fields)
		case Reconcile:
			done, err := s.reconcile(ctx, ch, in, token, fields)
			if done || err != nil {
				return err
			}
		}
		if in.Attempts > ch.MaxAttempts {
			return s.park(ctx, in, token, StatusFailed, fmt.Sprintf("outcome unknown and %d attempts used; last error: %s", ch.MaxAttempts, in.LastError), fields)
		}
	}
	return s.send(ctx, ch, in, token, recovered, fields)
}

// release gives an intent back when the sender stops (see Close): to PENDING if it was
// certainly not sent, otherwise to SENDING with its lease ended, for the channel's policy.
func (s *Sender) release(ctx context.Context, in Intent, token string, inDoubt bool, reason string, fields watermill.LogFields) error {
	var err error
	if inDoubt {
		err = s.finish(ctx, s.qReleaseInDoubt, fields, in.ID, token, "outcome unknown: "+reason+"; the next sender applies the channel's policy")
	} else {
		err = s.finish(ctx, s.qReleaseNotSent, fields, in.ID, token)
	}
	if err != nil {
		return err
	}
	s.released.Add(1)
	s.logger.Info("Sender stopping: intent given back", fields.Add(watermill.LogFields{"in_doubt": inDoubt, "reason": reason}))
	return nil
}

// reconcile asks the provider whether it has the intent. done=true means the intent reached
// its next state; done=false means it was not found and must be sent.
func (s *Sender) reconcile(ctx context.Context, ch Channel, in Intent, token string, fields watermill.LogFields) (bool, error) {
	lookupCtx, cancel := context.WithTimeout(idemkey.WithKey(ctx, in.Key), s.config.SendTimeout)
	id, found, err := ch.Provider.(Lookuper).Lookup(lookupCtx, in)
	cancel()
	switch {
	case err != nil && ctx.Err() != nil:
		// Stopping: the lookup is not the intent's failure; the next sender looks again.
		return true, s.release(ctx, in, token, true, fmt.Sprintf("sender stopped during the reconcile lookup (%v)", err), fields)
	case err != nil:
		msg := fmt.Sprintf("reconcile lookup failed: %v", err)
		if in.Attempts >= ch.MaxAttempts {
			return true, s.park(ctx, in, token, StatusFailed, fmt.Sprintf("outcome unknown after %d attempts; %s", in.Attempts, msg), fields)
		}
		s.logger.Error("Intent lookup failed; will look again", err, fields)
		return true, s.finish(ctx, s.qUnknown, fields, in.ID, token, s.backoff(in.Attempts).Microseconds(), msg)
	case found:
		if id == "" {
			id = "(unknown)"
		}
		s.reconciled.Add(1)
		traceOutcome(ctx, string(StatusSent), tracing.Duplicate.Bool(true)) // the provider had it
		s.logger.Info("Intent reconciled: the provider had it; not sent again", fields.Add(watermill.LogFields{"provider_id": id}))
		if err := s.finish(ctx, s.qSent, fields, in.ID, token, id); err != nil {
			return true, err
		}
		s.sent.Add(1)
		return true, nil
	}
	s.logger.Info("Intent not found at the provider; sending it", fields)
	return false, nil
}

// send calls the provider. recovered says the intent was already in doubt before this call.
func (s *Sender) send(ctx context.Context, ch Channel, in Intent, token string, recovered bool, fields watermill.LogFields) error {
	if ctx.Err() != nil {
		return s.release(ctx, in, token, recovered, "sender stopped before the provider call", fields)
	}
	in.Status = StatusSending
	sendCtx, cancel := context.WithTimeout(idemkey.WithKey(ctx, in.Key), s.config.SendTimeout)
	id, err := callSend(sendCtx, ch.Provider, in)
	cancel()
	if err == nil {
		if id == "" {
			id = "(none)"
		}
		if err := s.finish(ctx, s.qSent, fields, in.ID, token, id); err != nil {
			return err
		}
		s.sent.Add(1)
		traceOutcome(ctx, string(StatusSent), tracing.Duplicate.Bool(false))
		s.logger.Debug("Intent sent", fields.Add(watermill.LogFields{"provider_id": id}))
		return nil
	}
	if ctx.Err() != nil && !wmonce.IsPermanent(err) {
		// Stopping mid-call. NotSent is certain; anything else may have reached the provider:
		// hand it to the channel's policy at the next sender, as after a crash, without waiting
		// out the lease.
		notSent := IsNotSent(err)
		return s.release(ctx, in, token, !notSent || recovered, fmt.Sprintf("sender stopped during the provider call (%v)", err), fields)
	}
	switch {
	case wmonce.IsPermanent(err):
		return s.park(ctx, in, token, StatusFailed, "rejected by the provider: "+err.Error(), fields)
	case in.Attempts >= ch.MaxAttempts:
		return s.park(ctx, in, token, StatusFailed, fmt.Sprintf("gave up after %d attempts: %v", in.Attempts, err), fields)
	case IsNotSent(err):
		s.retried.Add(1)
		traceOutcome(ctx, string(StatusPending))
		s.logger.Info("Intent not sent; retrying later", fields.Add(watermill.LogFields{"err": err.Error()}))
		return s.finish(ctx, s.qPending, fields, in.ID, token, s.backoff(in.Attempts).Microseconds(), err.Error())
	}
	s.unknown.Add(1)
	traceOutcome(ctx, "unknown: "+ch.OnCrash.String())
	s.logger.Error("Intent send outcome unknown; applying the channel's crash policy", err, fields.Add(watermill.LogFields{"policy": ch.OnCrash.String()}))
	msg := "outcome unknown: " + err.Error()
	switch ch.OnCrash {
	case Skip:
		return s.park(ctx, in, token, StatusSkipped, msg+"; skipped by policy: the effect happened once or not at all. Requeue to send it anyway", fields)
	case Reconcile:
		return s.finish(ctx, s.qUnknown, fields, in.ID, token, s.backoff(in.Attempts).Microseconds(), msg)
	default: // Resend
		return s.finish(ctx, s.qPending, fields, in.ID, token, s.backoff(in.Attempts).Microseconds(), msg)
	}
}

func callSend(ctx context.Context, p Provider, in Intent) (id string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("provider panicked: %v", r)
		}
	}()
	return p.Send(ctx, in)
}

func (s *Sender) park(ctx context.Context, in Intent, token string, status Status, reason string, fields watermill.LogFields) error {
	if err := s.finish(ctx, s.qPark, fields, in.ID, token, string(status), reason); err != nil {
		return err
	}
	traceOutcome(ctx, string(status))
	if status == StatusSkipped {
		s.skipped.Add(1)
	} else {
		s.failed.Add(1)
	}
	s.logger.Error("Intent parked as "+string(status)+": needs attention", errors.New(reason), fields)
	return nil
}

// finish runs one fenced state change. It survives the cancellation of ctx for a few seconds,
// so that a sender being stopped still records an outcome it already has.
func (s *Sender) finish(ctx context.Context, query string, fields watermill.LogFields, args ...any) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	res, err := s.db.ExecContext(fctx, query, args...)
	if err != nil {
		s.errs.Add(1)
		return fmt.Errorf("intent: record outcome of intent %v: %w", args[0], err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		s.leaseLost.Add(1)
		s.logger.Error("Intent outcome not recorded: the lease ran out and another sender took the intent over", nil, fields)
	}
	return nil
}

// backoff is the delay after the given failed attempt of an intent (1-based).
func (s *Sender) backoff(attempt int) time.Duration {
	return worker.Delay(s.config.Backoff, s.config.MaxBackoff, attempt)
}
