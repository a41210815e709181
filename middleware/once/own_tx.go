package once

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/pgtx"
)

// runInOwnTx is the normal path: one transaction of our own per attempt.
func (e *Middleware) runInOwnTx(origCtx context.Context, h message.HandlerFunc, d *delivery) error {
	ctx, release := detachForShutdown(origCtx, e.config.ShutdownGrace)
	defer release()
	var last error
	return pgtx.Retry(ctx, e.config.TxRetry, func(ctx context.Context, attempt int) error {
		if attempt > 1 {
			d.counters.txRetries.Add(1)
			e.logger.Debug("Transaction lost a race, running it again", d.fields.Add(watermill.LogFields{"attempt": attempt - 1, "sqlstate": pgtx.SQLState(last)}))
		}
		last = e.attemptOwnTx(ctx, h, d)
		if e.ensurePartition(ctx, last) {
			last = e.attemptOwnTx(ctx, h, d) // the missing day partition exists now
		}
		return last
	})
}

func (e *Middleware) attemptOwnTx(ctx context.Context, h message.HandlerFunc, d *delivery) (err error) {
	tx, err := e.db.BeginTx(ctx, e.config.TxOptions)
	if err != nil {
		return fmt.Errorf("once: begin: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback()
		}
	}()

	// The claim opens the attempt guard (internal/txguard): from here until Close, a COMMIT
	// the handler sends is refused by the server. The guard on the wire opens on its own, at
	// no cost: the connection answers it.
	if e.guard.OnWire() {
		if err := e.guard.Open(ctx, tx); err != nil {
			return fmt.Errorf("once: %w", err)
		}
	}
	fresh, err := e.claim(ctx, tx, d)
	if err != nil || !fresh {
		return err // a duplicate wrote nothing; the deferred rollback ends the transaction
	}
	if err := e.apply(ctx, h, d, tx); err != nil {
		return err
	}
	if err := e.guard.Close(ctx, tx); err != nil {
		if isEnded(err) {
			return e.handlerEndedTx(d, err)
		}
		return err
	}
	done = true
	err = tx.Commit()
	d.committed(err)
	if err != nil {
		// The outcome of a failed COMMIT can be unknown (connection lost). Nack either way: if it
		// did commit, the redelivery finds the key and is acked without effect.
		d.counters.failed.Add(1)
		return fmt.Errorf("once: commit: %w", err)
	}
	d.counters.fresh.Add(1)
	return nil
}
