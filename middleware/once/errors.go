package once

import "errors"

// ErrNoConsumer is returned for a message whose consumer name cannot be determined: no
// Config.Consumer and no handler name in the message context (the middleware runs outside a
// router handler).
var ErrNoConsumer = errors.New("once: no consumer name: set Config.Consumer, or run the middleware inside a Watermill router handler")

// ErrUnstorableOutput is wrapped (with outbox.ErrInvalidMessage, which says why) when the
// handler returns a message the outbox can never store: an empty or over-long UUID, a topic
// the outbox's ValidateTopic refuses, a UUID or metadata that is not valid UTF-8 text. Such errors are permanent: every retry would return the same message.
var ErrUnstorableOutput = errors.New("once: handler output cannot be stored")
