package intent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/idemkey"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/worker"
)

// What happens to a claimed intent: process applies the crash policy to one recovered from
// SENDING, send calls the provider and records what its answer says, release gives it back
// when the sender stops, park sets it aside as FAILED or SKIPPED.

// process carries a claimed intent to its next state. recovered says it was found in SENDING
// after its lease ran out.
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
		err = s.finish(ctx, s.q.releaseInDoubt, fields, in.ID, token, "outcome unknown: "+reason+"; the next sender applies the channel's policy")
	} else {
		err = s.finish(ctx, s.q.releaseNotSent, fields, in.ID, token)
	}
	if err != nil {
		return err
	}
	s.released.Add(1)
	s.logger.Info("Sender stopping: intent given back", fields.Add(watermill.LogFields{"in_doubt": inDoubt, "reason": reason}))
	in.Status = StatusPending
	if inDoubt {
		in.Status = StatusSending
	}
	s.testSignals.Released.Signal(in)
	return nil
}

// markSent records the intent as SENT with the provider's id.
func (s *Sender) markSent(ctx context.Context, in Intent, token, providerID string, fields watermill.LogFields) error {
	if err := s.finish(ctx, s.q.sent, fields, in.ID, token, providerID); err != nil {
		return err
	}
	s.sent.Add(1)
	in.Status, in.ProviderID = StatusSent, providerID
	s.testSignals.Sent.Signal(in)
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
		return true, s.finish(ctx, s.q.unknown, fields, in.ID, token, s.backoff(in.Attempts).Microseconds(), msg)
	case found:
		if id == "" {
			id = "(unknown)"
		}
		s.reconciled.Add(1)
		traceOutcome(ctx, string(StatusSent), tracing.Duplicate.Bool(true)) // the provider had it
		s.logger.Info("Intent reconciled: the provider had it; not sent again", fields.Add(watermill.LogFields{"provider_id": id}))
		return true, s.markSent(ctx, in, token, id, fields)
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
		if err := s.markSent(ctx, in, token, id, fields); err != nil {
			return err
		}
		traceOutcome(ctx, string(StatusSent), tracing.Duplicate.Bool(false))
		s.logger.Debug("Intent sent", fields.Add(watermill.LogFields{"provider_id": id}))
		return nil
	}
	return s.sendFailed(ctx, ch, in, token, recovered, err, fields)
}

// sendFailed records what a failed Send says about the effect: nothing happened (NotSent:
// retried with backoff), refused (Permanent) or attempts used up (FAILED), or unknown (the
// channel's policy). When the sender is stopping, the intent is given back instead.
func (s *Sender) sendFailed(ctx context.Context, ch Channel, in Intent, token string, recovered bool, err error, fields watermill.LogFields) error {
	if ctx.Err() != nil && !wmonce.IsPermanent(err) {
		// Stopping mid-call. NotSent is certain; anything else may have reached the provider:
		// hand it to the channel's policy at the next sender, as after a crash, without waiting
		// out the lease.
		notSent := isNotSent(err)
		return s.release(ctx, in, token, !notSent || recovered, fmt.Sprintf("sender stopped during the provider call (%v)", err), fields)
	}
	switch {
	case wmonce.IsPermanent(err):
		return s.park(ctx, in, token, StatusFailed, "rejected by the provider: "+err.Error(), fields)
	case in.Attempts >= ch.MaxAttempts:
		return s.park(ctx, in, token, StatusFailed, fmt.Sprintf("gave up after %d attempts: %v", in.Attempts, err), fields)
	case isNotSent(err):
		s.retried.Add(1)
		traceOutcome(ctx, string(StatusPending))
		s.logger.Info("Intent not sent; retrying later", fields.Add(watermill.LogFields{"err": err.Error()}))
		return s.finish(ctx, s.q.pending, fields, in.ID, token, s.backoff(in.Attempts).Microseconds(), err.Error())
	}
	return s.sendUnknown(ctx, ch, in, token, err, fields)
}

// sendUnknown hands a Send whose outcome is unknown to the channel's policy: Skip parks it,
// Reconcile looks it up before the next send, Resend sends it again after the backoff.
func (s *Sender) sendUnknown(ctx context.Context, ch Channel, in Intent, token string, err error, fields watermill.LogFields) error {
	s.unknown.Add(1)
	traceOutcome(ctx, "unknown: "+ch.OnCrash.String())
	s.logger.Error("Intent send outcome unknown; applying the channel's crash policy", err, fields.Add(watermill.LogFields{"policy": ch.OnCrash.String()}))
	msg := "outcome unknown: " + err.Error()
	switch ch.OnCrash {
	case Skip:
		return s.park(ctx, in, token, StatusSkipped, msg+"; skipped by policy: the effect happened once or not at all. Requeue to send it anyway", fields)
	case Reconcile:
		return s.finish(ctx, s.q.unknown, fields, in.ID, token, s.backoff(in.Attempts).Microseconds(), msg)
	default: // Resend
		return s.finish(ctx, s.q.pending, fields, in.ID, token, s.backoff(in.Attempts).Microseconds(), msg)
	}
}

// callSend calls the provider, turning a panic into an error (an unknown outcome).
func callSend(ctx context.Context, p Provider, in Intent) (id string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("provider panicked: %v", r)
		}
	}()
	return p.Send(ctx, in)
}

// park sets the intent aside as status (FAILED or SKIPPED) with reason, for an operator.
func (s *Sender) park(ctx context.Context, in Intent, token string, status Status, reason string, fields watermill.LogFields) error {
	if err := s.finish(ctx, s.q.park, fields, in.ID, token, string(status), reason); err != nil {
		return err
	}
	traceOutcome(ctx, string(status))
	if status == StatusSkipped {
		s.skipped.Add(1)
	} else {
		s.failed.Add(1)
	}
	s.logger.Error("Intent parked as "+string(status)+": needs attention", errors.New(reason), fields)
	in.Status, in.LastError = status, reason
	s.testSignals.Parked.Signal(in)
	return nil
}

// backoff is the delay after the given failed attempt of an intent (1-based).
func (s *Sender) backoff(attempt int) time.Duration {
	return worker.Delay(s.config.Backoff, s.config.MaxBackoff, attempt)
}
