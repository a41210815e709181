package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// The attempt guard (internal/txguard) keeps a handler from ending the processing transaction
// it is lent: each processing transaction opens it before the first handler runs and closes it
// just before the Processor's own COMMIT. In between any COMMIT is refused (by the connection
// on a pool from pgtx.Open, at no cost to the server; by the server on other pools: see
// txguard.For), so a handler's tx.Commit() rolls everything back and nothing of the attempt is
// applied; database/sql
// marks the *sql.Tx done either way (Commit or Rollback), and the Processor tells by the next
// statement it sends in it: txguard.Check after a handler that failed or shares its transaction
// with other rows, or its own output store, completion or Close. The row is then parked at once
// (a permanent failure of that row alone): running it again would end the transaction again.

// requireGuard checks, once per Processor, that the schema has the attempt guard (migration
// 011; 017 for the server's guard). Without it every processing transaction would fail at the handler's first statement,
// which would park every row; instead the workers wait, as for a claim that fails, and log what
// to run.
func (p *Processor) requireGuard(ctx context.Context) error {
	if p.guardFound.Load() {
		return nil
	}
	var found bool
	proc, migration := pgtx.QualifiedName(p.config.Schema, "attempt_open")+"()", "011"
	if !p.guard.OnWire() {
		// The server's guard closes with attempt_close, which fails once a handler ended the
		// transaction (migration 017).
		proc, migration = pgtx.QualifiedName(p.config.Schema, "attempt_close")+"()", "017"
	}
	if err := p.db.QueryRowContext(ctx, `SELECT to_regprocedure($1) IS NOT NULL`, proc).Scan(&found); err != nil {
		return fmt.Errorf("inbox: look for the attempt guard: %w", err)
	}
	if !found {
		return fmt.Errorf("inbox: procedure %s is missing (the attempt guard, migration %s): run the migrations (migrate.Migrate or `wmonce migrate up`)", proc, migration)
	}
	p.guardFound.Store(true)
	return nil
}

// endedAt returns the row's permanent error if err, from a statement the Processor sent in tx
// after the handler returned, says that the handler had ended tx (sql.ErrTxDone while ctx, the
// transaction's, is alive, or txguard.Close's error); else nil.
func (p *Processor) endedAt(ctx context.Context, r claimedRow, err error) error {
	switch {
	case isEnded(err):
		return p.handlerEndedTx(r, err)
	case txguard.IsEnded(ctx, err):
		return p.handlerEndedTx(r, txguard.Ended(err))
	}
	return nil
}

// handlerEndedTx counts and logs an attempt whose handler ended its processing transaction and
// returns the row's permanent error (ended, from txguard or lend).
func (p *Processor) handlerEndedTx(r claimedRow, ended error) error {
	p.endedTx.Add(1)
	err := fmt.Errorf("inbox: row %d: %w", r.id, ended)
	p.logger.Error("The handler ended the processing transaction it was given (Commit or Rollback): nothing of it was applied; the row is parked", err,
		watermill.LogFields{"row": r.id, "message_id": r.messageID, "attempt": r.attempts})
	return err
}

// isEnded reports the error of a handler that ended its transaction.
func isEnded(err error) bool { return errors.Is(err, wmonce.ErrHandlerEndedTx) }
