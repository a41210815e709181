package migrate

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"math"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

// Direction says whether Migrate applies migrations or reverts them.
type Direction string

const (
	DirectionUp   Direction = "up"
	DirectionDown Direction = "down"
)

// Config selects the schema the tables live in.
type Config struct {
	// Schema holds every table, created if missing. Default pgtx.DefaultSchema ("wmonce").
	Schema string
}

func (c *Config) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
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
	// TargetVersion is, for up, the last version to apply (0: latest), for down the one to keep.
	TargetVersion int
	// MaxSteps limits how many migrations run; 0: no limit, except that a down without a
	// TargetVersion reverts one step (AllSteps: everything).
	MaxSteps int
}

// Result lists the versions a Migrate call applied or reverted, in order.
type Result struct {
	Direction Direction
	Versions  []int
	// From and To are the versions found and left, both read under the migration lock.
	From, To int
}

// Migrate applies (DirectionUp) or reverts (DirectionDown) migrations (Opts: how far), under
// the migration lock from the version it finds once it holds it (see the package doc). It
// refuses, before running anything, a schema whose version table it cannot plan from
// (ErrChangedMigration, ErrMissingVersion, ErrUnrecordedSchema for up) and stops before its
// next migration if the version table changes under the lock. A call that waits logs so at
// info level; ctx ends the wait.
func (m *Migrator) Migrate(ctx context.Context, direction Direction, opts *Opts) (Result, error) {
	if opts == nil {
		opts = &Opts{}
	}
	res := Result{Direction: direction}
	if err := m.checkRequest(direction, opts); err != nil {
		return res, err
	}
	conn, err := m.lockedConn(ctx)
	if err != nil {
		return res, err
	}
	defer m.unlock(ctx, conn)

	current, err := m.start(ctx, conn, direction)
	if err != nil {
		return res, err
	}
	res.From, res.To = current, current
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

// start prepares and checks the version table under the lock and returns the version a
// Migrate call plans from.
func (m *Migrator) start(ctx context.Context, conn *sql.Conn, direction Direction) (int, error) {
	if err := m.prepareVersions(ctx, conn, direction); err != nil {
		return 0, err
	}
	state, err := m.readState(ctx, conn)
	if err != nil {
		return 0, err
	}
	return state.Version, m.checkStart(state, direction)
}

// checkRequest refuses an unknown direction or target version.
func (m *Migrator) checkRequest(direction Direction, opts *Opts) error {
	if direction != DirectionUp && direction != DirectionDown {
		return fmt.Errorf("migrate: direction must be %q or %q, got %q", DirectionUp, DirectionDown, direction)
	}
	if !between(opts.TargetVersion, -1, len(m.migrations)) { // 0 (none) to the latest
		return fmt.Errorf("migrate: target version %d does not exist (latest is %d)", opts.TargetVersion, len(m.migrations))
	}
	return nil
}

// prepareVersions creates the version table for up and checks the applied migrations, under
// the lock.
func (m *Migrator) prepareVersions(ctx context.Context, conn *sql.Conn, direction Direction) error {
	if direction == DirectionUp {
		if err := m.ensureVersionTable(ctx, conn); err != nil {
			return err
		}
	}
	return m.verifyApplied(ctx, conn)
}

// checkStart refuses a version table Migrate cannot plan from, or a version newer than this
// binary's.
func (m *Migrator) checkStart(state State, direction Direction) error {
	if err := m.checkState(state, direction); err != nil {
		return err
	}
	if state.Version > len(m.migrations) {
		return fmt.Errorf("migrate: schema %q is at version %d but this binary knows only up to %d: upgrade watermill-once", m.schema, state.Version, len(m.migrations))
	}
	return nil
}

// plan returns the migrations a call runs from version current, in the order it runs them.
func (m *Migrator) plan(direction Direction, current int, opts *Opts) []Migration {
	steps := maxSteps(direction, opts)
	if direction == DirectionDown {
		return m.planDown(current, opts.TargetVersion, steps)
	}
	return m.planUp(current, cmp.Or(opts.TargetVersion, len(m.migrations)), steps)
}

// maxSteps is how many migrations a call may run: Opts.MaxSteps, else all of them, except one
// for a down without a target (a bare down never drops every table).
func maxSteps(direction Direction, opts *Opts) int {
	if opts.MaxSteps != 0 {
		return opts.MaxSteps
	}
	if direction == DirectionDown && opts.TargetVersion == 0 {
		return 1
	}
	return AllSteps
}

// planUp is the migrations after current up to target, at most steps of them.
func (m *Migrator) planUp(current, target, steps int) []Migration {
	return m.migrations[current : current+max(0, min(target-current, steps))]
}

// planDown is the migrations from current down to above target, newest first, at most steps
// of them.
func (m *Migrator) planDown(current, target, steps int) []Migration {
	var path []Migration
	for v := current; v > max(target, current-steps); v-- {
		path = append(path, m.migrations[v-1])
	}
	return path
}

// lockedConn opens the connection that holds the migration lock for a call, and takes the lock
// (m.unlock releases both).
func (m *Migrator) lockedConn(ctx context.Context) (*sql.Conn, error) {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: open the connection that holds the migration lock: %w", err)
	}
	if err := m.lock(ctx, conn); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// between reports whether version v is after `after` and at most upTo: the versions an up
// from after to upTo applies, or a down from upTo to after reverts.
func between(v, after, upTo int) bool { return v > after && v <= upTo }

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
		return m.recordVersion(ctx, tx, direction, mig)
	})
	if err != nil {
		return from, err
	}
	m.logger.Info("Migration "+string(direction), watermill.LogFields{"version": mig.Version, "name": mig.Name})
	return to, nil
}

// checkBaseline refuses to baseline a schema that records migrations or has no tables.
func (m *Migrator) checkBaseline(state State) error {
	switch {
	case state.Version > 0:
		return fmt.Errorf("migrate: schema %q records migrations up to %d already: baseline is only for a schema that records none", m.schema, state.Version)
	case !state.Unrecorded:
		return fmt.Errorf("migrate: schema %q has no watermill-once tables: nothing to record; run `wmonce -schema %s migrate up`", m.schema, m.schema)
	}
	return nil
}

// recordVersion writes (up) or deletes (down) mig's version row in tx.
func (m *Migrator) recordVersion(ctx context.Context, tx *sql.Tx, direction Direction, mig Migration) error {
	var err error
	if direction == DirectionUp {
		_, err = tx.ExecContext(ctx, `INSERT INTO `+m.versionTable()+` (version, name, checksum) VALUES ($1, $2, $3)`, mig.Version, mig.Name, mig.Checksum())
	} else {
		_, err = tx.ExecContext(ctx, `DELETE FROM `+m.versionTable()+` WHERE version = $1`, mig.Version)
	}
	if err != nil {
		return fmt.Errorf("migrate: record version %d: %w", mig.Version, err)
	}
	return nil
}

// recordApplied writes the version rows of migs in one transaction on conn.
func (m *Migrator) recordApplied(ctx context.Context, conn *sql.Conn, migs []Migration) error {
	return pgtx.RunInTx(ctx, conn, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		for _, mig := range migs {
			if err := m.recordVersion(ctx, tx, DirectionUp, mig); err != nil {
				return err
			}
		}
		return nil
	})
}

// Baseline records versions 1 to version as applied without running them, for a schema built
// from an earlier release's printed SQL (State.Unrecorded): give the last version that SQL held.
// It trusts version: the tables are not compared with the migrations.
func (m *Migrator) Baseline(ctx context.Context, version int) error {
	if !between(version, 0, len(m.migrations)) {
		return fmt.Errorf("migrate: baseline version must be between 1 and %d, got %d", len(m.migrations), version)
	}
	conn, err := m.lockedConn(ctx)
	if err != nil {
		return err
	}
	defer m.unlock(ctx, conn)
	if err := m.ensureVersionTable(ctx, conn); err != nil {
		return err
	}
	state, err := m.readState(ctx, conn)
	if err != nil {
		return err
	}
	if err := m.checkBaseline(state); err != nil {
		return err
	}
	if err := m.recordApplied(ctx, conn, m.migrations[:version]); err != nil {
		return err
	}
	m.logger.Info("Recorded migrations applied without version rows", watermill.LogFields{"version": version})
	return nil
}
