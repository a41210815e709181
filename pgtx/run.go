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

// RetryPolicy bounds how often a transaction runs again after a serialization failure or deadlock.
type RetryPolicy struct {
	// MaxAttempts counts the first run. Default 3; 1 disables retries.
	MaxAttempts int
	// Backoff is the wait before the second attempt, doubling per attempt (up to 1024 times),
	// each drawn between half and all of it (jitter). Default 5ms.
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

// Executor is "the transaction you pass in" (outbox.Writer.PublishTx, inbox.Receiver.StoreTx,
// ...): a *sql.Tx, so that the write commits with the caller's others. With a *sql.DB or
// *sql.Conn each statement commits on its own.
type Executor interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Beginner is satisfied by *sql.DB and *sql.Conn.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// RunInTx runs fn in a transaction begun on db with opts, whose context carries the transaction
// (TxFromContext), and commits it when fn returns nil. A serialization failure or deadlock of fn
// or the commit runs fn again in a new transaction, as Retry describes; any other error or a
// panic rolls back and is returned (or propagates).
func RunInTx(ctx context.Context, db Beginner, opts *sql.TxOptions, policy RetryPolicy, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if setup.IsNil(db) {
		return errors.New("pgtx: RunInTx: db is nil")
	}
	return Retry(ctx, policy, func(ctx context.Context, _ int) error {
		return runOnce(ctx, db, opts, fn)
	})
}

// Retry is the module's one retry of whole transactions, for callers that begin and end them
// themselves. It calls attempt (n from 1) until it returns nil or an error IsRetryableTx refuses,
// or policy.MaxAttempts attempts were made, waiting policy.Delay between attempts (the wait ends
// with ctx: the last error is returned joined with the context's cause).
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
