package wmonce

import (
	"errors"
	"fmt"

	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// PermanentError marks a failure that retrying the same message cannot fix (a bad key, an
// undecodable payload): every component that retries parks it at once instead.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError. Handlers may return Permanent(err) for poison input.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err (or anything it wraps) is a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// PanicError is what a component returns when the handler it runs panics: the transaction is
// rolled back exactly as for an error.
type PanicError struct {
	Value any
	Stack string
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// IsPanic reports a recovered panic, ours or Watermill's Recoverer's.
func IsPanic(err error) bool {
	var p *PanicError
	var wp wmiddleware.RecoveredPanicError
	return errors.As(err, &p) || errors.As(err, &wp)
}

// ErrOutputWithoutTopic is wrapped, as a permanent error, when a handler returns messages but
// nothing names a topic for them (the router handler's publish topic, or the component's
// Config.OutputTopic); each component's error says which setting to fix.
var ErrOutputWithoutTopic = errors.New("wmonce: handler returned messages but there is no topic for them")

// ErrMalformedMetadata is wrapped by errors about metadata a component needs and cannot read
// (an occurred_at that is not a time, or none where it is required). Such errors are permanent.
var ErrMalformedMetadata = errors.New("wmonce: malformed message metadata")

// ErrTooOld is wrapped by the age guards' refusals (Config.MaxMessageAge of the middleware and
// of the inbox Receiver). Permanent.
var ErrTooOld = errors.New("wmonce: message older than MaxMessageAge")

// ErrHandlerEndedTx is wrapped, as a permanent error, when user code called Commit or Rollback
// on the transaction the library lent it: the attempt guard refuses that COMMIT, so nothing of
// it is applied (no claim, no effect, no output), and the message is never acked as applied.
var ErrHandlerEndedTx = errors.New("wmonce: the handler ended the transaction it was given (Commit or Rollback on the transaction from the context); nothing of it was applied")
