package intent

import (
	"context"
	"errors"
	"fmt"
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
