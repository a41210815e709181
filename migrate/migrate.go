// Package migrate creates and upgrades watermill-once's tables: versioned SQL migrations
// embedded in the binary, applied under a PostgreSQL advisory lock, recorded in a version
// table, in a schema of your choice.
//
// # Use
//
//	m, err := migrate.New(db, migrate.Config{Schema: "wmonce"}, logger)
//	res, err := m.Migrate(ctx, migrate.DirectionUp, nil)
//
// Teams that run their own migration tool can print the SQL instead (Print, or
// `wmonce migrate print`) and apply it there; the printed SQL has the schema name already
// quoted in and carries no version bookkeeping.
//
// # Guarantees
//
// A Migrate call holds a session-level advisory lock, derived from the schema name, for its whole
// run: it reads the version and plans its path only once it holds the lock, and runs each
// migration in its own transaction together with its version row. Any number of instances may
// call Migrate at the same time, in either direction: the calls run one after the other, whole,
// each from the version the previous one left (see Migrator.Migrate). A failed migration rolls
// back completely and leaves the version at the last migration that committed.
package migrate

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

//go:embed sql/*.sql
var migrationFS embed.FS

// Direction says whether Migrate applies migrations or reverts them.
type Direction string

const (
	DirectionUp   Direction = "up"
	DirectionDown Direction = "down"
)

// Migration is one numbered step with its up and down SQL, the schema placeholder unresolved.
type Migration struct {
	Version int
	Name    string
	up      string
	down    string
}

// Config selects the schema the tables live in.
type Config struct {
	// Schema holds every table of watermill-once. Default pgtx.DefaultSchema ("wmonce").
	// It is created if missing.
	Schema string
}

func (c *Config) setDefaults() {
	if c.Schema == "" {
		c.Schema = pgtx.DefaultSchema
	}
}

// Validate reports a schema name that is not a safe identifier.
func (c Config) Validate() error {
	return pgtx.ValidateIdentifier("schema", c.Schema)
}

// Migrator applies and reverts the embedded migrations on one database and schema.
type Migrator struct {
	db         *sql.DB
	schema     string
	migrations []Migration
	lockKey    int64
	logger     watermill.LoggerAdapter
}

// New returns a Migrator. It does not touch the database.
func New(db *sql.DB, config Config, logger watermill.LoggerAdapter) (*Migrator, error) {
	logger, err := setup.Component(db, "migrate: db is nil", &config, (*Config).setDefaults, "migrate: invalid config", logger)
	if err != nil {
		return nil, err
	}
	migrations, err := All()
	if err != nil {
		return nil, err
	}
	return &Migrator{
		db:         db,
		schema:     config.Schema,
		migrations: migrations,
		lockKey:    lockKey(config.Schema),
		logger:     logger.With(watermill.LogFields{"schema": config.Schema}),
	}, nil
}

// AllSteps as Opts.MaxSteps lets a down migration revert everything.
const AllSteps = math.MaxInt

// Opts narrows a Migrate call.
type Opts struct {
	// TargetVersion stops at this version: for up, the last version to apply (0 = latest); for
	// down, the version to leave in place.
	TargetVersion int
	// MaxSteps limits how many migrations run. Zero means no limit for up and ONE step for down,
	// so that a bare "down" never drops every table; pass AllSteps to revert everything.
	MaxSteps int
}

// Result lists the versions a Migrate call applied or reverted, in order.
type Result struct {
	Direction Direction
	Versions  []int
	// From is the version the call found once it held the migration lock, and To the version
	// it left: both read under the lock, unlike a Version call before or after Migrate.
	From, To int
}

var filePattern = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.(up|down)\.sql$`)

// All returns every embedded migration, ordered by version.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFS, "sql")
	if err != nil {
		return nil, fmt.Errorf("migrate: read embedded migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := filePattern.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migrate: embedded file %q is not named NNN_name.(up|down).sql", e.Name())
		}
		version, _ := strconv.Atoi(m[1])
		body, err := migrationFS.ReadFile("sql/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("migrate: read %s: %w", e.Name(), err)
		}
		mig := byVersion[version]
		if mig == nil {
			mig = &Migration{Version: version, Name: m[2]}
			byVersion[version] = mig
		}
		if m[3] == "up" {
			mig.up = string(body)
		} else {
			mig.down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			return nil, fmt.Errorf("migrate: migration %03d_%s lacks its up or down file", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrate: migration versions must be 1..N without gaps; found %03d at position %d", m.Version, i+1)
		}
	}
	return out, nil
}

// Latest returns the highest embedded version.
func Latest() int {
	all, err := All()
	if err != nil || len(all) == 0 {
		return 0
	}
	return all[len(all)-1].Version
}

// render substitutes the quoted schema name into a migration body.
func render(body, schema string) string {
	return strings.ReplaceAll(body, "{{schema}}", pgtx.QuoteIdentifier(schema))
}

// Print returns the SQL of the migrations between two versions for teams that apply SQL with
// their own tools: for DirectionUp the migrations after fromVersion up to toVersion (0 = latest),
// preceded by CREATE SCHEMA IF NOT EXISTS; for DirectionDown those from fromVersion down to
// above toVersion, newest first. No version table is written by the printed SQL.
func Print(schema string, direction Direction, fromVersion, toVersion int) (string, error) {
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	all, err := All()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	switch direction {
	case DirectionUp:
		if toVersion == 0 {
			toVersion = all[len(all)-1].Version
		}
		fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n", pgtx.QuoteIdentifier(schema))
		for _, m := range all {
			if m.Version > fromVersion && m.Version <= toVersion {
				fmt.Fprintf(&b, "\n-- %03d_%s (up)\n%s", m.Version, m.Name, render(m.up, schema))
			}
		}
	case DirectionDown:
		for i := len(all) - 1; i >= 0; i-- {
			m := all[i]
			if m.Version <= fromVersion && m.Version > toVersion {
				fmt.Fprintf(&b, "\n-- %03d_%s (down)\n%s", m.Version, m.Name, render(m.down, schema))
			}
		}
	default:
		return "", fmt.Errorf("migrate: direction must be %q or %q, got %q", DirectionUp, DirectionDown, direction)
	}
	return b.String(), nil
}

func lockKey(schema string) int64 { return worker.LockKey("migrate", schema) }

func (m *Migrator) versionTable() string { return pgtx.QualifiedName(m.schema, "schema_migrations") }

// queryRower is what readVersion needs: *sql.DB, *sql.Conn and *sql.Tx all have it.
type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Version returns the highest applied version, 0 when nothing is applied (or the schema does
// not exist yet). It reads without the migration lock: while a Migrate call runs, the answer
// may be out of date by the time it returns. Result.From and Result.To are read under the lock.
func (m *Migrator) Version(ctx context.Context) (int, error) {
	return m.readVersion(ctx, m.db)
}

func (m *Migrator) readVersion(ctx context.Context, q queryRower) (int, error) {
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

// Migrate applies (DirectionUp) or reverts (DirectionDown) migrations. See Opts for limits.
//
// One call is one run under one lock: Migrate takes a session-level advisory lock, derived from
// the schema name, on a connection of its own, and holds it until it returns. Only after it holds
// the lock does it read the version and plan its path (up: every migration after the current
// version up to TargetVersion or the latest; down: from the current version down to above
// TargetVersion), then runs that path on the same connection, each migration in its own
// transaction together with its version row. So concurrent calls, from this process or any other,
// run one after the other, whole: a down never starts while another call's up is under way, and
// each call runs its own path once, from wherever the call before it left the schema (an up after
// a down brings the schema to the latest again; a down to TargetVersion reverts from whatever is
// current). A call that has to wait logs so at info level; the wait ends with an error naming
// the lock when ctx ends.
//
// A failed migration rolls back completely: the schema stays at the last version that
// committed, which Result.To reports, and Result.Versions lists what this call did. If the version
// table changes under the lock (something wrote it without taking the lock, such as SQL from
// Print applied by hand), the call stops before its next migration with an error saying so.
//
// Limit: the lock is held by the connection's session. If that connection breaks, the server
// releases the lock and the call fails at its next statement; a migration that had not
// committed is rolled back.
func (m *Migrator) Migrate(ctx context.Context, direction Direction, opts *Opts) (Result, error) {
	if opts == nil {
		opts = &Opts{}
	}
	res := Result{Direction: direction}
	if direction != DirectionUp && direction != DirectionDown {
		return res, fmt.Errorf("migrate: direction must be %q or %q, got %q", DirectionUp, DirectionDown, direction)
	}
	if opts.TargetVersion < 0 || opts.TargetVersion > len(m.migrations) {
		return res, fmt.Errorf("migrate: target version %d does not exist (latest is %d)", opts.TargetVersion, len(m.migrations))
	}
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return res, fmt.Errorf("migrate: open the connection that holds the migration lock: %w", err)
	}
	if err := m.lock(ctx, conn); err != nil {
		_ = conn.Close()
		return res, err
	}
	defer m.unlock(ctx, conn)

	if direction == DirectionUp {
		if err := m.ensureVersionTable(ctx, conn); err != nil {
			return res, err
		}
	}
	current, err := m.readVersion(ctx, conn)
	if err != nil {
		return res, err
	}
	res.From, res.To = current, current
	if current > len(m.migrations) {
		return res, fmt.Errorf("migrate: schema %q is at version %d but this binary knows only up to %d: upgrade watermill-once", m.schema, current, len(m.migrations))
	}
	for _, mig := range m.plan(direction, current, opts) {
		to, err := m.apply(ctx, conn, direction, mig, res.To)
		if err != nil {
			return res, err
		}
		res.To = to
		res.Versions = append(res.Versions, mig.Version)
	}
	return res, nil
}

// plan returns the migrations a call runs from version current, in the order it runs them.
func (m *Migrator) plan(direction Direction, current int, opts *Opts) []Migration {
	maxSteps := opts.MaxSteps
	if maxSteps == 0 {
		maxSteps = AllSteps
		if direction == DirectionDown {
			maxSteps = 1
		}
	}
	var path []Migration
	if direction == DirectionUp {
		target := opts.TargetVersion
		if target == 0 {
			target = len(m.migrations)
		}
		for v := current + 1; v <= target && len(path) < maxSteps; v++ {
			path = append(path, m.migrations[v-1])
		}
		return path
	}
	for v := current; v > opts.TargetVersion && len(path) < maxSteps; v-- {
		path = append(path, m.migrations[v-1])
	}
	return path
}

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
	fields := watermill.LogFields{"lock_key": m.lockKey}
	classid, objid := worker.LockKeyParts(m.lockKey)
	var holder int
	// Best effort: the holder may have let go already, and the wait below tells.
	if conn.QueryRowContext(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = $1 AND objid = $2 AND objsubid = 1`, classid, objid).Scan(&holder) == nil {
		fields["holder_pid"] = holder
	}
	m.logger.Info("Waiting for another migration of this schema to finish", fields)
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, m.lockKey); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			err = errors.Join(err, cause)
		}
		return fmt.Errorf("migrate: wait for the migration lock of schema %q (advisory lock %d), held by another migration: %w", m.schema, m.lockKey, err)
	}
	return nil
}

// unlock releases the migration lock and closes conn. A connection that cannot confirm the
// release is discarded rather than returned to the pool, so that the lock goes with its session
// and no pooled connection keeps it.
func (m *Migrator) unlock(ctx context.Context, conn *sql.Conn) {
	unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var released bool
	err := conn.QueryRowContext(unlockCtx, `SELECT pg_advisory_unlock($1)`, m.lockKey).Scan(&released)
	if err != nil || !released {
		m.logger.Error("Could not release the migration lock; closing its connection", err, watermill.LogFields{"lock_key": m.lockKey, "released": released})
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = conn.Close()
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

// apply runs one migration of the plan and its version row in one transaction on conn, and
// returns the version it leaves. from is the version the plan expects before the migration; if
// the version table says otherwise, something changed it without the lock and apply refuses.
func (m *Migrator) apply(ctx context.Context, conn *sql.Conn, direction Direction, mig Migration, from int) (int, error) {
	body, to := mig.up, mig.Version
	if direction == DirectionDown {
		body, to = mig.down, mig.Version-1
	}
	err := pgtx.RunInTx(ctx, conn, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		current, err := m.readVersion(ctx, tx)
		if err != nil {
			return err
		}
		if current != from {
			return fmt.Errorf("migrate: schema %q went from version %d to %d while this migration held the migration lock: "+
				"something wrote %s without the lock (SQL applied by hand?); stopped before %s %03d_%s, check the schema and run migrate again",
				m.schema, from, current, m.versionTable(), direction, mig.Version, mig.Name)
		}
		if _, err := tx.ExecContext(ctx, render(body, m.schema)); err != nil {
			return fmt.Errorf("migrate: %s %03d_%s: %w", direction, mig.Version, mig.Name, err)
		}
		if direction == DirectionUp {
			_, err = tx.ExecContext(ctx, `INSERT INTO `+m.versionTable()+` (version, name) VALUES ($1, $2)`, mig.Version, mig.Name)
		} else {
			_, err = tx.ExecContext(ctx, `DELETE FROM `+m.versionTable()+` WHERE version = $1`, mig.Version)
		}
		if err != nil {
			return fmt.Errorf("migrate: record version %d: %w", mig.Version, err)
		}
		return nil
	})
	if err != nil {
		return from, err
	}
	m.logger.Info("Migration "+string(direction), watermill.LogFields{"version": mig.Version, "name": mig.Name})
	return to, nil
}
