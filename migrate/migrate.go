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
// Each migration runs in its own transaction together with its version row, holding a
// transaction-level advisory lock derived from the schema name. Any number of instances may call
// Migrate at the same time: one applies each migration, the others wait and then find it applied.
// A failed migration rolls back completely and leaves the version where it was.
package migrate

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

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

// Version returns the highest applied version, 0 when nothing is applied (or the schema does
// not exist yet).
func (m *Migrator) Version(ctx context.Context) (int, error) {
	var exists bool
	err := m.db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.versionTable()).Scan(&exists)
	if err != nil {
		return 0, fmt.Errorf("migrate: read version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	err = m.db.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM `+m.versionTable()).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("migrate: read version: %w", err)
	}
	return v, nil
}

// Migrate applies (DirectionUp) or reverts (DirectionDown) migrations. See Opts for limits.
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
	if direction == DirectionUp {
		if err := m.ensureVersionTable(ctx); err != nil {
			return res, err
		}
	}
	maxSteps := opts.MaxSteps
	if maxSteps == 0 {
		maxSteps = AllSteps
		if direction == DirectionDown {
			maxSteps = 1
		}
	}
	for steps := 0; steps < maxSteps; steps++ {
		version, done, err := m.step(ctx, direction, opts.TargetVersion)
		if err != nil {
			return res, err
		}
		if done {
			return res, nil
		}
		res.Versions = append(res.Versions, version)
	}
	return res, nil
}

func (m *Migrator) ensureVersionTable(ctx context.Context) error {
	return pgtx.RunInTx(ctx, m.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, m.lockKey); err != nil {
			return fmt.Errorf("migrate: take advisory lock: %w", err)
		}
		_, err := tx.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgtx.QuoteIdentifier(m.schema)+`;
CREATE TABLE IF NOT EXISTS `+m.versionTable()+` (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`)
		if err != nil {
			return fmt.Errorf("migrate: create schema and version table: %w", err)
		}
		return nil
	})
}

// step applies or reverts the next migration under the advisory lock, re-reading the version
// after taking the lock so that concurrent migrators never apply the same step twice.
func (m *Migrator) step(ctx context.Context, direction Direction, target int) (version int, done bool, err error) {
	err = pgtx.RunInTx(ctx, m.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, m.lockKey); err != nil {
			return fmt.Errorf("migrate: take advisory lock: %w", err)
		}
		var current int
		var exists bool
		if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.versionTable()).Scan(&exists); err != nil {
			return fmt.Errorf("migrate: look for version table: %w", err)
		}
		if exists {
			if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM `+m.versionTable()).Scan(&current); err != nil {
				return fmt.Errorf("migrate: read version: %w", err)
			}
		}
		if current > len(m.migrations) {
			return fmt.Errorf("migrate: schema %q is at version %d but this binary knows only up to %d: upgrade watermill-once", m.schema, current, len(m.migrations))
		}
		var mig Migration
		var body string
		if direction == DirectionUp {
			if current >= len(m.migrations) || (target > 0 && current >= target) {
				done = true
				return nil
			}
			mig = m.migrations[current]
			body = mig.up
		} else {
			if current == 0 || current <= target {
				done = true
				return nil
			}
			mig = m.migrations[current-1]
			body = mig.down
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
		version = mig.Version
		m.logger.Info("Migration "+string(direction), watermill.LogFields{"version": mig.Version, "name": mig.Name})
		return nil
	})
	return version, done, err
}
