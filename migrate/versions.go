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

// Version returns the highest applied version (0: none, or no schema), read without the
// migration lock.
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
`+versionTableDDL(m.schema))
	if err != nil {
		return fmt.Errorf("migrate: create schema and version table: %w", err)
	}
	return nil
}

// versionTableDDL creates the version table if it is missing: one statement, shared by
// Migrate and the SQL from Print, so that both keep the same bookkeeping.
func versionTableDDL(schema string) string {
	return `CREATE TABLE IF NOT EXISTS ` + pgtx.QualifiedName(schema, "schema_migrations") + ` (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    checksum   text
)`
}

// State is what a schema's version table says.
type State struct {
	Version int // the highest applied version (Migrator.Version)
	// Missing lists the versions below Version without a row (ErrMissingVersion).
	Missing []int
	// Unrecorded: tables but no version row (ErrUnrecordedSchema; see Baseline).
	Unrecorded bool
}

// State reads the version table, without the migration lock (see Version).
func (m *Migrator) State(ctx context.Context) (State, error) {
	return m.readState(ctx, m.db)
}

func (m *Migrator) readState(ctx context.Context, q pgtx.Executor) (State, error) {
	var s State
	var tables bool
	err := q.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgtx.QualifiedName(m.schema, "processed_messages")).Scan(&tables)
	if err != nil {
		return s, fmt.Errorf("migrate: read version: %w", err)
	}
	if s.Version, err = m.readVersion(ctx, q); err != nil {
		return s, err
	}
	if s.Version == 0 {
		s.Unrecorded = tables
		return s, nil
	}
	// Versions are applied and reverted in order, so 1..Version must all have a row.
	missing, err := pgtx.QueryAll(ctx, q, scanInt, `SELECT v FROM generate_series(1, $1::int) AS v
WHERE NOT EXISTS (SELECT FROM `+m.versionTable()+` WHERE version = v) ORDER BY v`, s.Version)
	if err != nil {
		return s, fmt.Errorf("migrate: read version: %w", err)
	}
	if len(missing) > 0 {
		s.Missing = missing
	}
	return s, nil
}

func scanInt(s pgtx.Scanner) (int, error) {
	var v int
	err := s.Scan(&v)
	return v, err
}

// ErrMissingVersion: the version table lacks a row below its highest version; nothing runs.
var ErrMissingVersion = errors.New("migrate: the version table lacks a row below its highest version")

// ErrUnrecordedSchema: Migrate up found watermill-once's tables but no version row (see
// Baseline).
var ErrUnrecordedSchema = errors.New("migrate: the schema has watermill-once tables but records no migration")

// checkState refuses a version table Migrate cannot plan from: a gap, or tables without rows.
func (m *Migrator) checkState(s State, direction Direction) error {
	if len(s.Missing) > 0 {
		return fmt.Errorf("%w: schema %q is at version %d; %s", ErrMissingVersion, m.schema, s.Version, MissingAdvice(m.schema, s.Missing))
	}
	if s.Unrecorded && direction == DirectionUp {
		return fmt.Errorf("%w: schema %q; %s", ErrUnrecordedSchema, m.schema, BaselineAdvice(m.schema))
	}
	return nil
}

// BaselineAdvice says how to record the versions of a State.Unrecorded schema.
func BaselineAdvice(schema string) string {
	return fmt.Sprintf("if it was built from `wmonce migrate print` SQL of an earlier release, record the migrations "+
		"that SQL held with `wmonce -schema %s migrate baseline N` (N: its last \"-- NNN_name (up)\" line), then run `wmonce -schema %s migrate up`", schema, schema)
}

// MissingAdvice says how to record the versions of State.Missing.
func MissingAdvice(schema string, missing []int) string {
	all, _ := All() // embedded: All fails only on a broken build, which every test catches
	names := make([]string, len(missing))
	values := make([]string, len(missing))
	for i, v := range missing {
		name := "?" // a newer binary's
		if v >= 1 && v <= len(all) {
			name = all[v-1].Name
		}
		names[i] = fmt.Sprintf("%03d_%s", v, name)
		values[i] = fmt.Sprintf("(%d, '%s')", v, name)
	}
	return fmt.Sprintf("the version table has no row for %s (deleted by hand?). If those migrations' tables are in place, record them "+
		"(the next migrate fills in the checksums): INSERT INTO %s (version, name) VALUES %s; otherwise restore the schema from a backup",
		strings.Join(names, ", "), pgtx.QualifiedName(schema, "schema_migrations"), strings.Join(values, ", "))
}

// ErrChangedMigration: an applied migration's up SQL (checksum) or name differs from this
// binary's; nothing runs.
var ErrChangedMigration = errors.New("migrate: an applied migration differs from this binary's")

// verifyApplied compares the version table with the embedded migrations, under the migration
// lock, before anything runs. A version recorded without a checksum (applied before version
// tables kept one, or by SQL from Print) gets this binary's, so a later change is caught.
func (m *Migrator) verifyApplied(ctx context.Context, conn *sql.Conn) error {
	exists, err := m.prepareVersionTable(ctx, conn)
	if err != nil || !exists {
		return err
	}
	changed, unrecorded, err := m.compareApplied(ctx, conn)
	if err != nil {
		return err
	}
	if len(changed) > 0 {
		return fmt.Errorf("%w in schema %q: %s. A migration must not change once applied: add a new one instead. "+
			"If the tables are known to match this binary's migration N, let the next Migrate record it: UPDATE %s SET name = '<its name here>', checksum = NULL WHERE version = N",
			ErrChangedMigration, m.schema, strings.Join(changed, "; "), m.versionTable())
	}
	return m.recordChecksums(ctx, conn, unrecorded)
}

// prepareVersionTable reports whether the version table exists, and gives an older binary's
// its checksum column.
func (m *Migrator) prepareVersionTable(ctx context.Context, conn *sql.Conn) (bool, error) {
	var exists, hasChecksum bool
	err := conn.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL, EXISTS (
    SELECT FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'checksum' AND NOT attisdropped)`, m.versionTable()).Scan(&exists, &hasChecksum)
	if err != nil {
		return false, fmt.Errorf("migrate: read the version table: %w", err)
	}
	if exists && !hasChecksum { // an older binary's version table; ALTER only then, for its exclusive lock
		if _, err := conn.ExecContext(ctx, `ALTER TABLE `+m.versionTable()+` ADD COLUMN IF NOT EXISTS checksum text`); err != nil {
			return false, fmt.Errorf("migrate: add the checksum column to the version table: %w", err)
		}
	}
	return exists, nil
}

// compareApplied reads the version table: changed describes each applied migration whose name
// or checksum differs from this binary's, unrecorded are those applied without a checksum.
func (m *Migrator) compareApplied(ctx context.Context, conn *sql.Conn) (changed []string, unrecorded []Migration, err error) {
	rows, err := pgtx.QueryAll(ctx, conn, scanVersionRow, `SELECT version, name, coalesce(checksum, '') FROM `+m.versionTable()+` ORDER BY version`)
	if err != nil {
		return nil, nil, fmt.Errorf("migrate: read the version table: %w", err)
	}
	for _, r := range rows {
		if !between(r.version, 0, len(m.migrations)) {
			continue // a newer binary's: Migrate refuses it by version
		}
		mig := m.migrations[r.version-1]
		switch {
		case r.name != mig.Name:
			changed = append(changed, fmt.Sprintf("%03d was applied as %q, is %q here", r.version, r.name, mig.Name))
		case r.checksum == "":
			unrecorded = append(unrecorded, mig)
		case r.checksum != mig.Checksum():
			changed = append(changed, fmt.Sprintf("%03d_%s was applied with sha256 %s, is %s here", r.version, mig.Name, r.checksum, mig.Checksum()))
		}
	}
	return changed, unrecorded, nil
}

// versionRow is one row of the version table.
type versionRow struct {
	version        int
	name, checksum string
}

func scanVersionRow(s pgtx.Scanner) (versionRow, error) {
	var r versionRow
	err := s.Scan(&r.version, &r.name, &r.checksum)
	return r, err
}

// recordChecksums gives the migrations applied without a checksum this binary's.
func (m *Migrator) recordChecksums(ctx context.Context, conn *sql.Conn, unrecorded []Migration) error {
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
