// Package lend runs user code in a transaction the library lends it: the one step the
// effectively-once middleware (middleware/once) and the inbox Processor share. It builds the
// handler's context (the transaction, the message it consumes, its claim), runs the handler in
// a child span, finds out whether the handler ended the transaction (internal/txguard), and
// stores what the handler returned in the outbox within the same transaction. The caller
// begins, claims, commits and counts; Handle says what happened.
package lend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
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
}

// Handle runs h on d.Msg with tx in its context (Context) and stores its output in tx. ctx must
// be the context tx was begun with, or one that ends with it (txguard.Check). d.Msg keeps the
// handler's context afterwards; the caller restores what it needs.
func (s Step) Handle(ctx context.Context, tx *sql.Tx, h message.HandlerFunc, d Delivery) (Outcome, error) {
	hctx := Context(ctx, tx, d.Msg, d.Consumer, d.Key)
	d.Msg.SetContext(hctx)
	out, err := s.call(h, d.Msg)
	// With the server's guard, also before storing an output: after a COMMIT or ROLLBACK the
	// handler sent as SQL text the server is outside any transaction, and the store would run in
	// autocommit. The check travels with the store on a pool from pgtx.Open (DeferredPrefix).
	if err != nil || d.Shared || len(out) > 0 && !s.Guard.OnWire() {
		if ended := s.Guard.Check(ctx, tx); errors.Is(ended, wmonce.ErrHandlerEndedTx) {
			if err != nil {
				// Reported, not wrapped: the handler's error must not make this one look retryable.
				ended = fmt.Errorf("%w (the handler returned: %s)", ended, err.Error())
			}
			return EndedTx, ended
		}
	}
	if err != nil {
		if errors.Is(err, outbox.ErrInvalidMessage) && !wmonce.IsPermanent(err) {
			// The handler published a message the outbox can never store (Writer.Publisher):
			// running it again produces the same message.
			return HandlerFailed, wmonce.Permanent(err)
		}
		return HandlerFailed, err
	}
	if len(out) == 0 {
		return Applied, nil
	}
	if d.OutputTopic == "" {
		return OutputRefused, wmonce.Permanent(fmt.Errorf("%s: %w: %s", s.Component, wmonce.ErrOutputWithoutTopic, s.NoTopic))
	}
	if err := s.Outbox.PublishTx(hctx, tx, d.OutputTopic, out...); err != nil {
		if txguard.IsEnded(ctx, err) {
			return EndedTx, txguard.Ended(err)
		}
		err = fmt.Errorf("%s: store handler output: %w", s.Component, err)
		if errors.Is(err, outbox.ErrInvalidMessage) {
			if s.Unstorable != nil {
				err = fmt.Errorf("%w: %w", s.Unstorable, err)
			}
			return OutputRefused, wmonce.Permanent(err) // every retry would return the same output
		}
		return OutputRefused, err
	}
	return Applied, nil
}

// call runs h in a child span of the message's context, with panics turned into errors.
func (s Step) call(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	hctx := msg.Context()
	ctx, span := tracing.StartChild(hctx, s.Tracer, tracing.SpanHandler)
	msg.SetContext(ctx)
	out, err := wmonce.CallHandler(h, msg)
	msg.SetContext(hctx)
	tracing.End(span, err)
	return out, err
}
