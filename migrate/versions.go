package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/pgtx"
)

// The version table, schema_migrations: one row per applied migration.

func (m *Migrator) versionTable() string { return pgtx.QualifiedName(m.schema, "schema_migrations") }

// Version returns the highest applied version, 0 when nothing is applied (or the schema does
// not exist yet). It reads without the migration lock: while a Migrate call runs, the answer
// may be out of date by the time it returns. Result.From and Result.To are read under the lock.
func (m *Migrator) Version(ctx context.Context) (int, error) {
	return m.readVersion(ctx, m.db)
}

// readVersion reads the highest applied version through q: the pool, the connection that holds
// the lock, or a migration's transaction.
func (m *Migrator) readVersion(ctx context.Context, q pgtx.Executor) (int, error) {
	var exists bool
	err := q.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.versionTable()).Scan(&exists)
	if err != nil {
		return 0, fmt.Errorf("migrate: read version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	err = q.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM `+m.versionTable()).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("migrate: read version: %w", err)
	}
	return v, nil
}

func (m *Migrator) ensureVersionTable(ctx context.Context, conn *sql.Conn) error {
	_, err := conn.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgtx.QuoteIdentifier(m.schema)+`;
CREATE TABLE IF NOT EXISTS `+m.versionTable()+` (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    checksum   text
)`)
	if err != nil {
		return fmt.Errorf("migrate: create schema and version table: %w", err)
	}
	return nil
}

// ErrChangedMigration is returned by Migrate when a migration the schema has applied differs
// from this binary's (its up SQL's checksum or its name): the tables are not what the binary's
// migrations describe, so none is applied or reverted.
var ErrChangedMigration = errors.New("migrate: an applied migration differs from this binary's")

// verifyApplied compares the version table with the embedded migrations, under the migration
// lock, before anything runs. A version recorded without a checksum (applied before version
// tables kept one, or by SQL from Print) gets this binary's, so a later change is caught.
func (m *Migrator) verifyApplied(ctx context.Context, conn *sql.Conn) error {
	var exists, hasChecksum bool
	err := conn.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL, EXISTS (
    SELECT FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'checksum' AND NOT attisdropped)`, m.versionTable()).Scan(&exists, &hasChecksum)
	if err != nil {
		return fmt.Errorf("migrate: read the version table: %w", err)
	}
	if !exists {
		return nil
	}
	if !hasChecksum { // an older binary's version table; ALTER only then, for its exclusive lock
		if _, err := conn.ExecContext(ctx, `ALTER TABLE `+m.versionTable()+` ADD COLUMN IF NOT EXISTS checksum text`); err != nil {
			return fmt.Errorf("migrate: add the checksum column to the version table: %w", err)
		}
	}
	rows, err := conn.QueryContext(ctx, `SELECT version, name, coalesce(checksum, '') FROM `+m.versionTable()+` ORDER BY version`)
	if err != nil {
		return fmt.Errorf("migrate: read the version table: %w", err)
	}
	defer rows.Close()
	var changed []string
	var unrecorded []Migration
	for rows.Next() {
		var version int
		var name, checksum string
		if err := rows.Scan(&version, &name, &checksum); err != nil {
			return fmt.Errorf("migrate: read the version table: %w", err)
		}
		if version < 1 || version > len(m.migrations) {
			continue // a newer binary's: Migrate refuses it by version
		}
		mig := m.migrations[version-1]
		switch {
		case name != mig.Name:
			changed = append(changed, fmt.Sprintf("%03d was applied as %q, is %q here", version, name, mig.Name))
		case checksum == "":
			unrecorded = append(unrecorded, mig)
		case checksum != mig.Checksum():
			changed = append(changed, fmt.Sprintf("%03d_%s was applied with sha256 %s, is %s here", version, mig.Name, checksum, mig.Checksum()))
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("migrate: read the version table: %w", err)
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("migrate: read the version table: %w", err)
	}
	if len(changed) > 0 {
		return fmt.Errorf("%w in schema %q: %s. A migration must not change once applied: add a new one instead. "+
			"If the tables are known to match this binary's migration N, let the next Migrate record it: UPDATE %s SET name = '<its name here>', checksum = NULL WHERE version = N",
			ErrChangedMigration, m.schema, strings.Join(changed, "; "), m.versionTable())
	}
	for _, mig := range unrecorded {
		if _, err := conn.ExecContext(ctx, `UPDATE `+m.versionTable()+` SET checksum = $2 WHERE version = $1 AND checksum IS NULL`, mig.Version, mig.Checksum()); err != nil {
			return fmt.Errorf("migrate: record the checksum of %03d_%s: %w", mig.Version, mig.Name, err)
		}
	}
	if len(unrecorded) > 0 {
		m.logger.Info("Recorded the checksums of migrations applied without one", watermill.LogFields{"migrations": len(unrecorded)})
	}
	return nil
}
