package pgtx_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// A cancelled context ends the wait between attempts at once: with an hour of backoff, Retry
// returns only because it watches ctx (were it sleeping, the test would time out).
func TestRetryWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	serialization := &pgconn.PgError{Code: pgtx.CodeSerializationFailure}
	attempts := 0
	err := pgtx.Retry(ctx, pgtx.RetryPolicy{MaxAttempts: 3, Backoff: time.Hour}, func(context.Context, int) error {
		attempts++
		cancel() // the caller stops while the first attempt fails
		return serialization
	})
	require.Equal(t, 1, attempts, "no attempt after the context ended")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, serialization, "the attempt's error is kept")
}

func TestRetryStopsAtMaxAttemptsAndOnOtherErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	deadlock := &pgconn.PgError{Code: "40P01"} // deadlock_detected
	var seen []int
	err := pgtx.Retry(ctx, pgtx.RetryPolicy{MaxAttempts: 3, Backoff: time.Microsecond}, func(_ context.Context, n int) error {
		seen = append(seen, n)
		return deadlock
	})
	require.ErrorIs(t, err, deadlock)
	require.Equal(t, []int{1, 2, 3}, seen)

	other := errors.New("not retryable")
	calls := 0
	err = pgtx.Retry(ctx, pgtx.RetryPolicy{}, func(context.Context, int) error { calls++; return other })
	require.ErrorIs(t, err, other)
	require.Equal(t, 1, calls)
}

// RunInTx waits through Retry: cancelling its context during the wait returns at once.
func TestRunInTxWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx, cancel := context.WithCancel(context.Background())
	err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{MaxAttempts: 2, Backoff: time.Hour}, func(context.Context, *sql.Tx) error {
		cancel()
		return &pgconn.PgError{Code: pgtx.CodeSerializationFailure}
	})
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, pgtx.IsSerializationFailure(err))
}
