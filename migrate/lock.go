package migrate

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/worker"
)

// unlockTimeout bounds the release of the migration lock, which runs even when ctx has ended.
const unlockTimeout = 5 * time.Second

// lockKey is the advisory-lock key of schema's migrations.
func lockKey(schema string) int64 { return worker.LockKey("migrate", schema) }

// lock takes the migration lock on conn, waiting for the call that holds it (logged at info)
// until ctx ends.
func (m *Migrator) lock(ctx context.Context, conn *sql.Conn) error {
	var got bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, m.lockKey).Scan(&got); err != nil {
		return fmt.Errorf("migrate: take the migration lock of schema %q (advisory lock %d): %w", m.schema, m.lockKey, err)
	}
	if got {
		return nil
	}
	m.logWait(ctx, conn)
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, m.lockKey); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			err = errors.Join(err, cause)
		}
		return fmt.Errorf("migrate: wait for the migration lock of schema %q (advisory lock %d), held by another migration: %w", m.schema, m.lockKey, err)
	}
	return nil
}

// logWait logs that a call waits for the migration lock, with the process that holds it when
// it can tell (best effort: the holder may have let go already, and the wait tells).
func (m *Migrator) logWait(ctx context.Context, conn *sql.Conn) {
	fields := watermill.LogFields{"lock_key": m.lockKey}
	classid, objid := worker.LockKeyParts(m.lockKey)
	var holder int
	if conn.QueryRowContext(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = $1 AND objid = $2 AND objsubid = 1`, classid, objid).Scan(&holder) == nil {
		fields["holder_pid"] = holder
	}
	m.logger.Info("Waiting for another migration of this schema to finish", fields)
}

// unlock releases the migration lock and closes conn. A connection that cannot confirm the
// release is discarded rather than returned to the pool, so that the lock goes with its session
// and no pooled connection keeps it.
func (m *Migrator) unlock(ctx context.Context, conn *sql.Conn) {
	unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	var released bool
	err := conn.QueryRowContext(unlockCtx, `SELECT pg_advisory_unlock($1)`, m.lockKey).Scan(&released)
	if err != nil || !released {
		m.logger.Error("Could not release the migration lock; closing its connection", err, watermill.LogFields{"lock_key": m.lockKey, "released": released})
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = conn.Close()
}
