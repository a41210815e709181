package worker

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// unlockTimeout bounds the release of the lock when a lead ends, whatever ended it.
const unlockTimeout = time.Second

// Leader elects one active instance among the processes that share Key: the active one holds
// a session-level advisory lock (pg_try_advisory_lock) on a dedicated connection for as long as
// it leads; the others stand by and try again every Standby. The server releases the lock with
// the session, so when the leader stops or its connection breaks, a standby takes over within
// one Standby.
//
// Limit: leading is a belief. A leader whose connection broke learns it only at its next use of
// the connection, and another instance may lead meanwhile; work done under the lock must be
// fenced, or checked on the connection before it starts (Lead receives it).
type Leader struct {
	// DB opens the dedicated connection.
	DB *sql.DB
	// Key is the advisory-lock key (see LockKey).
	Key int64
	// Name is what the log lines call the worker ("Relay", "Janitor").
	Name string
	// Standby is the wait between two tries of a standby instance, and after a Lead that
	// returned nil.
	Standby time.Duration
	// Backoff is the wait after an error (Base doubling up to Max, with jitter); a try that
	// ends without error resets it.
	Backoff Backoff
	// OnError, when set, is called with each error and the wait before the next try.
	OnError func(err error, wait time.Duration)
	Logger  watermill.LoggerAdapter

	leading atomic.Bool
}

// Leading reports whether this instance holds the lock right now.
func (l *Leader) Leading() bool { return l.leading.Load() }

// Run tries to lead until ctx ends, and returns nil then. While it holds the lock it calls
// lead with the connection that holds it; lead runs until ctx ends (it returns nil) or fails
// (the lock is released, and after the backoff this instance competes again). Errors are
// passed to OnError, never returned.
func (l *Leader) Run(ctx context.Context, lead func(ctx context.Context, conn *sql.Conn) error) error {
	logger := l.Logger
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	for ctx.Err() == nil {
		err := l.try(ctx, logger, lead)
		if ctx.Err() != nil {
			break
		}
		wait := l.Standby
		if err != nil {
			wait = l.Backoff.Next()
			if l.OnError != nil {
				l.OnError(err, wait)
			}
		} else {
			l.Backoff.Reset()
		}
		if !Sleep(ctx, wait) {
			break
		}
	}
	return nil
}

// try takes the lock and leads while it holds it. It returns nil at once when another
// instance holds it.
func (l *Leader) try(ctx context.Context, logger watermill.LoggerAdapter, lead func(context.Context, *sql.Conn) error) error {
	conn, err := l.DB.Conn(ctx)
	if err != nil {
		return fmt.Errorf("leadership connection: %w", err)
	}
	defer conn.Close()
	var got bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, l.Key).Scan(&got); err != nil {
		return fmt.Errorf("leadership lock: %w", err)
	}
	if !got {
		return nil
	}
	l.leading.Store(true)
	logger.Info(l.Name+" active", nil)
	signalLeading(l.Key)
	defer func() {
		l.leading.Store(false)
		// A lock held by a broken connection is released by the server with the session.
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
		_, _ = conn.ExecContext(unlockCtx, `SELECT pg_advisory_unlock($1)`, l.Key)
	}()
	return lead(ctx, conn)
}
