// Package txguard keeps user code from ending a transaction the library lends it. Every
// component that runs user code in a transaction of its own (the effectively-once middleware,
// its group commit, the inbox Processor, the HTTP middleware) opens the schema's attempt guard
// before the user code runs and closes it just before its own COMMIT. While the guard is open,
// the guard row's deferred trigger (migrations 010 and 011) refuses any COMMIT: a handler that
// calls Commit on the transaction gets an error and the server rolls everything back, so a
// claim never commits without its effects and outputs, nor effects without their claim.
// Rollback cannot be refused, and needs not be: nothing is applied either way.
//
// database/sql marks the *sql.Tx done when user code calls Commit or Rollback, whatever the
// server answered. Check, called after the user code returns, tells the component, so that it
// treats the delivery as a permanent failure of its own (wmonce.ErrHandlerEndedTx) instead of
// blaming the next statement or the next message of a group.
//
// Every statement here is a pgwire.DeferredPrefix statement: on a pool from pgtx.Open it travels
// with the transaction's next statement (Open with the first, Close with COMMIT) and Check costs
// no network round trip at all. On another pool each is one round trip of its own.
//
// For a pool from pgtx.Open with lazy BEGIN, For returns the guard on the wire instead
// (pgwire.GuardOpen): the connection itself refuses a COMMIT while the guard is open, by
// sending a ROLLBACK and the same error in its place, and the server does no work for the guard
// at all (no guard row, no deferred trigger at COMMIT, no Condition in the first statement).
package txguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/pgwire"
	"github.com/wmonce/watermill-once/pgtx"
)

// Guard holds one schema's guard statements.
type Guard struct {
	open, check, close string
	wire               bool
}

// For returns the guard for transactions on db: the guard on the wire when db's connections
// have it (pgwire.Guards), else the server's guard of schema (New). A caller whose first
// statement opens the guard with Condition leaves Condition out when OnWire says so, and calls
// Open instead.
func For(schema string, db *sql.DB) Guard {
	if pgwire.Guards(db) {
		return Guard{open: pgwire.GuardOpen, check: pgwire.GuardCheck, close: pgwire.GuardClose, wire: true}
	}
	return New(schema)
}

// OnWire reports whether g is the guard on the wire (see For).
func (g Guard) OnWire() bool { return g.wire }

// New returns the server's guard of schema (a validated identifier), for transactions on any
// pool: the guard row's deferred trigger refuses the COMMIT.
func New(schema string) Guard {
	return Guard{
		open:  pgwire.DeferredPrefix + "CALL " + pgtx.QualifiedName(schema, "attempt_open") + "()",
		check: pgwire.DeferredPrefix + "CALL " + pgtx.QualifiedName(schema, "attempt_check") + "()",
		close: pgwire.DeferredPrefix + "CALL " + pgtx.QualifiedName(schema, "attempt_close") + "()",
	}
}

// StateSetting names the transaction-local setting that holds the attempt's state (open,
// closed or doomed) for schema, as migration 010's functions spell it.
func StateSetting(schema string) string { return "wmonce." + pgtx.QuoteIdentifier("attempt_"+schema) }

// Open opens the guard in tx, a transaction the caller began and has not written in yet under
// this schema's guard. ctx should be the context tx was begun with. A schema without migration
// 011 fails here, or, when Open travels with the next statement, at that statement (IsMissing).
func (g Guard) Open(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, g.open); err != nil {
		if IsMissing(err) {
			return fmt.Errorf("txguard: the attempt guard is missing (attempt_open, migration 011): run the migrations: %w", err)
		}
		return fmt.Errorf("txguard: open: %w", err)
	}
	return nil
}

// Check reports whether user code ended tx while it held it: a permanent error wrapping
// wmonce.ErrHandlerEndedTx (and sql.ErrTxDone) if it did. ctx must be the context tx was begun
// with (or one that ends with it): when that context has ended, database/sql rolled tx back
// itself, and Check returns the context's error instead, which is nobody's fault.
func (g Guard) Check(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, g.check)
	switch {
	case err == nil:
		return nil
	case IsEnded(ctx, err):
		return Ended(err)
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case IsMissing(err):
		return fmt.Errorf("txguard: the attempt guard is missing (attempt_check, migration 017): run the migrations: %w", err)
	}
	return fmt.Errorf("txguard: check: %w", err)
}

// Close marks the attempt over, so that the caller's own COMMIT, which must follow, passes the
// guard. It travels with that COMMIT on a pool from pgtx.Open.
func (g Guard) Close(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, g.close)
	if IsEnded(ctx, err) {
		return Ended(err)
	}
	if IsMissing(err) {
		return fmt.Errorf("txguard: the attempt guard is missing (attempt_close, migration 017): run the migrations: %w", err)
	}
	if err != nil {
		return fmt.Errorf("txguard: close: %w", err)
	}
	return nil
}

// IsEnded reports an error of a statement the library sent in a transaction it lent to user
// code that says the user code ended it: database/sql's sql.ErrTxDone (Commit or Rollback on the
// *sql.Tx) while ctx, the context the transaction was begun with, is alive, or the attempt
// guard's refusal (pgwire.CodeAttemptGuard: COMMIT or ROLLBACK sent as SQL text, refused; every
// later statement of the attempt is refused the same way).
func IsEnded(ctx context.Context, err error) bool {
	return errors.Is(err, sql.ErrTxDone) && ctx.Err() == nil || pgtx.IsAttemptGuardRefusal(err)
}

// Ended is the permanent error of a transaction that user code ended: it wraps
// wmonce.ErrHandlerEndedTx and cause.
func Ended(cause error) error {
	return wmonce.Permanent(fmt.Errorf("%w: %w", wmonce.ErrHandlerEndedTx, cause))
}

// Condition returns a boolean SQL expression that opens the guard when evaluated once, for a
// caller whose first statement in the transaction can carry it (`INSERT ... SELECT ... WHERE
// <Condition>`): the same as Open, without a statement of its own.
func Condition(schema string) string { return pgtx.QualifiedName(schema, "attempt_begin") + "()" }

// IsMissing reports an error of a schema without the guard (its migrations not run): an
// undefined function, procedure, table or schema.
func IsMissing(err error) bool {
	switch pgtx.SQLState(err) {
	case pgtx.CodeUndefinedFunction, pgtx.CodeUndefinedTable, pgtx.CodeInvalidSchemaName:
		return true
	}
	return false
}
