// Package lend runs user code in a transaction the library lends it: the one step the
// effectively-once middleware (middleware/once) and the inbox Processor share. It builds the
// handler's context (the transaction, the message it consumes, its claim), runs the handler in
// a child span, finds out whether the handler ended the transaction (internal/txguard), and
// stores what the handler returned in the outbox within the same transaction. The caller
// begins, claims, commits and counts; Handle says what happened.
//
// The handler gets a message of its own (Handle): the delivery it stands for is acked or nacked
// by the router after the caller's COMMIT (or rollback), never by user code.
package lend

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Step is how one component lends its transactions.
type Step struct {
	// Component prefixes errors ("once", "inbox").
	Component string
	Guard     txguard.Guard
	Outbox    *outbox.Writer
	Tracer    trace.Tracer
	// NoTopic is what the permanent error says to set when a handler returns messages and the
	// caller has no topic for them.
	NoTopic string
	// Unstorable, if set, is wrapped into the permanent error of an output the outbox can never
	// store (once.ErrUnstorableOutput).
	Unstorable error
	// Logger receives the warning about a handler that acked or nacked its message (nil: none).
	Logger watermill.LoggerAdapter

	warned sync.Map // consumers whose handler was found acking its message: warned once each
}

// Outcome says what went wrong, for the caller's counting.
type Outcome int

const (
	// Applied: the handler succeeded and its output is stored; the caller may commit.
	Applied Outcome = iota
	// EndedTx: the handler committed or rolled back the transaction (a permanent error
	// wrapping wmonce.ErrHandlerEndedTx; nothing of it was applied).
	EndedTx
	// HandlerFailed: the handler returned an error or panicked.
	HandlerFailed
	// OutputRefused: the handler's output could not be stored (no topic, refused by the outbox,
	// or the store failed).
	OutputRefused
)

// Context returns ctx with what a handler finds in its message context: the transaction
// (pgtx.TxFromContext), the message it consumes (outbox causation and correlation ids for what it
// publishes) and its claim, consumer and dedupe key (keys for effects outside the database,
// idemkey).
func Context(ctx context.Context, tx *sql.Tx, msg *message.Message, consumer, key string) context.Context {
	return wmonce.ContextWithClaim(outbox.ContextWithConsumed(pgtx.ContextWithTx(ctx, tx), msg), consumer, key)
}

// Delivery is one run of a handler: the message, whose claim, and where its output goes.
type Delivery struct {
	Msg           *message.Message
	Consumer, Key string
	// OutputTopic receives the messages the handler returns ("": returning any is an error).
	OutputTopic string
	// Shared says that tx holds other deliveries' work too (a group, a batch, watermill-sql's
	// subscriber transaction): whether the handler ended it is then checked right after it
	// returns, so that the culprit and not a neighbour takes the blame. Otherwise only after a
	// failure: on success the outbox store or the caller's txguard.Close tells.
	Shared bool
	// HandlerAcked, if set, counts the runs whose handler called Ack or Nack on its message (the
	// component's Counters.HandlerAcked).
	HandlerAcked *atomic.Uint64
}

// Handle runs h with tx in its message's context (Context) and stores its output in tx. ctx must
// be the context tx was begun with, or one that ends with it (txguard.Check).
//
// h gets a message of its own: d.Msg's UUID, metadata and payload, with Ack and Nack that reach
// nobody. d.Msg is the delivery the caller answers for, and only after its COMMIT: a handler that
// acked it would let the broker forget the message before its effect is committed (lost if the
// attempt then fails or the commit does not happen), and inside watermill-sql's subscriber
// transaction the ack commits that transaction under the handler's feet. What the handler did to
// its own copy is ignored, counted (Delivery.HandlerAcked) and logged once per consumer. d.Msg is
// left as it was.
func (s *Step) Handle(ctx context.Context, tx *sql.Tx, h message.HandlerFunc, d Delivery) (Outcome, error) {
	// The consumed message in the context (outbox.ConsumedFromContext) is the handler's own too:
	// the delivery must not be reachable from the handler at all.
	own := d.Msg.Copy()
	hctx := Context(ctx, tx, own, d.Consumer, d.Key)
	own.SetContext(hctx)
	out, err := s.call(h, own)
	s.settledByHandler(own, d)
	if ended := s.endedByHandler(ctx, tx, d, collectedOnly(own), out, err); ended != nil {
		return EndedTx, ended
	}
	if err != nil {
		return HandlerFailed, handlerFailure(err)
	}
	return s.storeOutput(ctx, hctx, tx, d, out)
}

// endedByHandler returns the permanent error wrapping wmonce.ErrHandlerEndedTx if the handler
// ended tx, checked where it must be now: after a failure, in a shared transaction (so that the
// culprit takes the blame), and, with the server's guard, before storing an output (after a
// COMMIT or ROLLBACK the handler sent as SQL text the store would run in autocommit; on the
// wire the check travels with the store). Otherwise the store or txguard.Close tells. A
// handler that only handed its message to a batch (collected) has run nothing yet: the batch
// is checked once after it runs.
func (s *Step) endedByHandler(ctx context.Context, tx *sql.Tx, d Delivery, collected bool, out []*message.Message, err error) error {
	if err == nil && (!d.Shared || collected) && (len(out) == 0 || s.Guard.OnWire()) {
		return nil
	}
	ended := s.Guard.Check(ctx, tx)
	switch {
	case !errors.Is(ended, wmonce.ErrHandlerEndedTx):
		return nil
	case err != nil:
		// Reported, not wrapped: the handler's error must not make this one look retryable.
		return fmt.Errorf("%w (the handler returned: %s)", ended, err.Error())
	}
	return ended
}

// handlerFailure is the error of a failed handler: permanent when it published a message the
// outbox can never store (Writer.Publisher), since running it again produces the same message.
func handlerFailure(err error) error {
	if errors.Is(err, outbox.ErrInvalidMessage) && !wmonce.IsPermanent(err) {
		return wmonce.Permanent(err)
	}
	return err
}

// storeOutput stores the messages the handler returned in tx, for d.OutputTopic.
func (s *Step) storeOutput(ctx, hctx context.Context, tx *sql.Tx, d Delivery, out []*message.Message) (Outcome, error) {
	switch {
	case len(out) == 0:
		return Applied, nil
	case d.OutputTopic == "":
		return OutputRefused, wmonce.Permanent(fmt.Errorf("%s: %w: %s", s.Component, wmonce.ErrOutputWithoutTopic, s.NoTopic))
	}
	err := s.Outbox.PublishTx(hctx, tx, d.OutputTopic, out...)
	switch {
	case err == nil:
		return Applied, nil
	case txguard.IsEnded(ctx, err):
		return EndedTx, txguard.Ended(err)
	}
	err = fmt.Errorf("%s: store handler output: %w", s.Component, err)
	if !errors.Is(err, outbox.ErrInvalidMessage) {
		return OutputRefused, err
	}
	if s.Unstorable != nil {
		err = fmt.Errorf("%w: %w", s.Unstorable, err)
	}
	return OutputRefused, wmonce.Permanent(err) // every retry would return the same output
}

// View returns the delivery as the library's hooks (key functions, OccurredAt) see it: msg's
// UUID, metadata (the same map) and payload, with msg's context, and Ack and Nack that reach
// nobody, so that a hook cannot settle the delivery either. One small allocation, unlike
// msg.Copy: hooks run for every message and only read it.
func View(msg *message.Message) *message.Message {
	v := &message.Message{UUID: msg.UUID, Metadata: msg.Metadata, Payload: msg.Payload}
	v.SetContext(msg.Context())
	return v
}

// settledByHandler counts and reports a handler that acked or nacked the message it was given.
func (s *Step) settledByHandler(own *message.Message, d Delivery) {
	var call string
	select {
	case <-own.Acked():
		call = "Ack"
	case <-own.Nacked():
		call = "Nack"
	default:
		return
	}
	if d.HandlerAcked != nil {
		d.HandlerAcked.Add(1)
	}
	if _, seen := s.warned.LoadOrStore(d.Consumer, struct{}{}); seen || s.Logger == nil {
		return
	}
	// Watermill's logger has no warning level: an error-level line marked WARNING, as the
	// janitor's configuration warnings.
	s.Logger.Error("WARNING: the handler acked or nacked the message it was given; ignored (logged once per consumer, each counted in Counters.HandlerAcked)",
		fmt.Errorf("the handler called msg.%s(): the delivery is acked only after the %s component's COMMIT, and nacked after a failure; a handler must not settle it", call, s.Component),
		watermill.LogFields{"consumer": d.Consumer, "dedupe_key": d.Key, "message_uuid": d.Msg.UUID})
}

// call runs h in a child span of the message's context, with panics turned into errors.
func (s *Step) call(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	hctx := msg.Context()
	ctx, span := tracing.StartChild(hctx, s.Tracer, tracing.SpanHandler)
	msg.SetContext(ctx)
	out, err := callHandler(h, msg)
	msg.SetContext(hctx)
	tracing.End(span, err)
	return out, err
}

// callHandler calls h with msg and returns a panic of h as a *wmonce.PanicError, so that the
// caller rolls back and retries or parks it as any other failure.
func callHandler(h message.HandlerFunc, msg *message.Message) (out []*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &wmonce.PanicError{Value: r, Stack: string(debug.Stack())}
		}
	}()
	return h(msg)
}

// KeyDefaults fills in the dedupe-key settings a component's Config left zero: the message
// UUID as key (wmonce.KeyFromUUID), keys up to setup.DefaultMaxKeyLength bytes.
func KeyDefaults(key *wmonce.KeyFunc, maxKeyLength *int) {
	if *key == nil {
		*key = wmonce.KeyFromUUID()
	}
	*maxKeyLength = cmp.Or(*maxKeyLength, setup.DefaultMaxKeyLength)
}

// AgeGuardDefaults fills in the parts of a MaxMessageAge guard a component's Config left nil:
// the event time read from the RFC 3339 metadata the outbox stamps (outbox.MetadataOccurredAt),
// and time.Now as the clock.
func AgeGuardDefaults(occurredAt *func(*message.Message) (time.Time, bool, error), now *func() time.Time) {
	if *occurredAt == nil {
		*occurredAt = occurredAtFromMetadata
	}
	if *now == nil {
		*now = time.Now
	}
}

// occurredAtFromMetadata reads the event time from outbox.MetadataOccurredAt (RFC 3339).
func occurredAtFromMetadata(msg *message.Message) (time.Time, bool, error) {
	v := msg.Metadata.Get(outbox.MetadataOccurredAt)
	if v == "" {
		return time.Time{}, false, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("metadata %q is not an RFC 3339 time: %q", outbox.MetadataOccurredAt, v)
	}
	return t, true, nil
}
