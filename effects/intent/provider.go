package intent

import (
	"context"
	"errors"
	"fmt"
)

// Provider performs the external effect of an intent. Send gets in.Key in the context
// (idemkey.WithKey, which idemkey.Transport sends) and returns the provider's id of the effect.
// Its error says what is known: wmonce.Permanent (refused, nothing happened: FAILED at once),
// NotSent (nothing happened: retried with backoff), anything else (unknown: the CrashPolicy).
type Provider interface {
	Send(ctx context.Context, in Intent) (providerID string, err error)
}

// Lookuper is a provider that can look an effect up by the intent key (for Reconcile).
type Lookuper interface {
	// Lookup reports whether the effect for in.Key happened, and its id; found=false must
	// mean "definitely not performed": it leads to a send.
	Lookup(ctx context.Context, in Intent) (providerID string, found bool, err error)
}

// NotSent marks a Send error after which nothing happened (retried).
func NotSent(err error) error {
	if err == nil {
		return nil
	}
	return &notSentError{err}
}

type notSentError struct{ err error }

func (e *notSentError) Error() string { return "not sent: " + e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// isNotSent reports whether err was marked with NotSent.
func isNotSent(err error) bool {
	var n *notSentError
	return errors.As(err, &n)
}

// CrashPolicy says what a sender does with an intent whose outcome is unknown: found in
// SENDING after its lease ran out, or whose Send failed neither Permanent nor NotSent.
type CrashPolicy int

const (
	// PolicyDefault is Reconcile for a Lookuper; for others a configuration error.
	PolicyDefault CrashPolicy = iota
	// Reconcile looks the key up at the provider (a Lookuper): found is SENT, else send again.
	Reconcile
	// Resend sends again with the same key: a duplicate unless the provider honours it.
	Resend
	// Skip marks the intent SKIPPED: never a duplicate, possibly a gap.
	Skip
)

// policyNames are the CrashPolicy values' names, in their order.
var policyNames = [...]string{PolicyDefault: "default", Reconcile: "reconcile", Resend: "resend", Skip: "skip"}

func (p CrashPolicy) String() string {
	if p >= 0 && int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("CrashPolicy(%d)", int(p))
}
