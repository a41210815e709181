package once

import (
	"context"
	"database/sql"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/lend"
)

// apply runs the handler with tx in the message context and stores what it returns in the outbox
// (internal/lend, the step the inbox Processor shares), counting what went wrong.
func (e *Middleware) apply(ctx context.Context, h message.HandlerFunc, d *delivery, tx *sql.Tx) error {
	step := &e.step
	if d.inSubscriberTx {
		step = &e.subStep
	}
	outcome, err := step.Handle(ctx, tx, h, lend.Delivery{
		Msg: d.msg, Consumer: d.consumer, Key: d.key, OutputTopic: d.outputTopic, Shared: d.sharedTx, HandlerAcked: &d.counters.handlerAcked,
	})
	switch outcome {
	case lend.EndedTx:
		return e.handlerEndedTx(d, err)
	case lend.HandlerFailed, lend.OutputRefused:
		d.counters.failed.Add(1)
	}
	return err
}

// handlerEndedTx reports a delivery whose handler ended the transaction it was lent and returns
// ended, the permanent error (from txguard or lend).
func (e *Middleware) handlerEndedTx(d *delivery, ended error) error {
	d.counters.endedTx.Add(1)
	e.logger.Error("The handler ended the transaction it was given (Commit or Rollback): nothing of it was applied; the message is a permanent failure", ended, d.fields)
	return ended
}
