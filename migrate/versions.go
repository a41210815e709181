package migrate

import (
	"context"
	"database/sql"
	"fmt"

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
    applied_at timestamptz NOT NULL DEFAULT now()
)`)
	if err != nil {
		return fmt.Errorf("migrate: create schema and version table: %w", err)
	}
	return nil
}
