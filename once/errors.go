package middleware

import (
	"errors"
	"fmt"

	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// PermanentError marks a failure that retrying the same message cannot fix: a bad key, a
// payload that does not decode, a handler returning messages without a topic or messages the
// outbox cannot store (see ErrUnstorableOutput). The Stack parks
// such messages at once instead of retrying them.
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

// PanicError is what the middleware returns when the handler panics: the transaction is
// rolled back and the message nacked, exactly as for an error.
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

// ErrNoConsumer is returned for a message whose consumer name cannot be determined: no
// Config.Consumer and no handler name in the message context (the middleware runs outside a
// router handler).
var ErrNoConsumer = errors.New("no consumer name: set Config.Consumer, or run the middleware inside a Watermill router handler")

// ErrOutputWithoutTopic is returned when the handler returns messages but neither the router
// handler nor Config.OutputTopic names a topic for them.
var ErrOutputWithoutTopic = errors.New("handler returned messages but there is no topic for them: add the handler with router.AddHandler(..., publishTopic, ...) or set Config.OutputTopic")

// ErrUnstorableOutput is wrapped (with outbox.ErrInvalidMessage, which says why) when the
// handler returns a message the outbox can never store: an empty or over-long UUID, a topic
// the outbox's ValidateTopic refuses, a UUID or metadata that is not valid UTF-8 text. Such errors are permanent: every retry would return the same message.
var ErrUnstorableOutput = errors.New("handler output cannot be stored")

// ErrMalformedMetadata is wrapped by errors about metadata the middleware needs and cannot
// read (an occurred_at that is not a time, or none where PartitionByDay requires one). Such
// errors are permanent.
var ErrMalformedMetadata = errors.New("malformed message metadata")

// ErrTooOld is wrapped by the age guard's refusals (see Config.MaxMessageAge). Permanent.
var ErrTooOld = errors.New("message older than MaxMessageAge")
