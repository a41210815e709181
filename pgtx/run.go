package pgtx

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/worker"
)

// Defaults of RetryPolicy.
const (
	defaultRetryMaxAttempts = 3
	defaultRetryBackoff     = 5 * time.Millisecond
)

// RetryPolicy bounds how often RunInTx runs a transaction again after a serialization
// failure or deadlock.
type RetryPolicy struct {
	// MaxAttempts counts the first run. Default 3; 1 disables
	// retries.
	MaxAttempts int
	// Backoff is the wait before the second attempt; it doubles for each further attempt (up
	// to 1024 times Backoff), each wait drawn between half and all of that value (jitter) so
	// that the transactions that collided do not collide again. Default 5ms.
	Backoff time.Duration
}

// withDefaults fills in the defaults; a negative value counts as unset.
func (p RetryPolicy) withDefaults() RetryPolicy {
	p.MaxAttempts = cmp.Or(max(p.MaxAttempts, 0), defaultRetryMaxAttempts)
	p.Backoff = cmp.Or(max(p.Backoff, 0), defaultRetryBackoff)
	return p
}

// Delay returns the wait after the given failed attempt (1-based).
func (p RetryPolicy) Delay(attempt int) time.Duration {
	p = p.withDefaults()
	return worker.Delay(p.Backoff, p.Backoff<<10, attempt)
}

// Executor is the one interface for "the transaction you pass in" (outbox.Writer.PublishTx,
// inbox.Receiver.StoreTx, intent.Store.RecordTx, versioned's Apply functions, ...): a *sql.Tx,
// so that the write commits with the caller's other writes. *sql.DB and *sql.Conn satisfy it
// too, and each statement then commits on its own, tied to nothing else.
type Executor interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Beginner is satisfied by *sql.DB and *sql.Conn.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// RunInTx runs fn in a transaction begun on db with opts and commits it when fn returns nil.
// The context passed to fn carries the transaction (see TxFromContext).
//
// If fn or the commit fails with a serialization failure or deadlock, the transaction is
// rolled back and fn runs again in a new one, as Retry describes. Any other error from fn
// rolls back and is returned as is; fn must therefore not have effects outside the
// transaction that it cannot repeat. A panic in fn rolls back and propagates.
func RunInTx(ctx context.Context, db Beginner, opts *sql.TxOptions, policy RetryPolicy, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if setup.IsNil(db) {
		return errors.New("pgtx: RunInTx: db is nil")
	}
	return Retry(ctx, policy, func(ctx context.Context, _ int) error {
		return runOnce(ctx, db, opts, fn)
	})
}

// Retry is the module's one retry of whole transactions, for callers that begin and end their
// transactions themselves (RunInTx is built on it). It calls attempt with the attempt number
// (1-based) until attempt returns nil or an error IsRetryableTx refuses, or policy.MaxAttempts
// attempts have been made, and returns the last error. Between attempts it waits
// policy.Delay; the wait ends as soon as ctx ends, and Retry then returns the last error
// joined with the context's cause, without another attempt.
func Retry(ctx context.Context, policy RetryPolicy, attempt func(ctx context.Context, n int) error) error {
	policy = policy.withDefaults()
	for n := 1; ; n++ {
		err := attempt(ctx, n)
		if err == nil || !IsRetryableTx(err) || n >= policy.MaxAttempts {
			return err
		}
		if !worker.Sleep(ctx, policy.Delay(n)) {
			return errors.Join(err, context.Cause(ctx))
		}
	}
}

func runOnce(ctx context.Context, db Beginner, opts *sql.TxOptions, fn func(ctx context.Context, tx *sql.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("pgtx: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err := fn(ContextWithTx(ctx, tx), tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		committed = true // nothing left to roll back: COMMIT either happened or the tx is gone
		return fmt.Errorf("pgtx: commit: %w", err)
	}
	committed = true
	return nil
}
