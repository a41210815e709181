package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/migrate"
)

func migrateCommand() *command {
	return &command{
		name:    "migrate",
		summary: "create, upgrade, revert or print the schema",
		usage: `
migrate up [-to N]
migrate down [-steps N | -all | -to N]
migrate print [-down] [-from N] [-to N]
migrate baseline N
migrate version`,
		details: `
up      applies every migration not applied yet (or up to version N), each in its own
        transaction. A run holds the schema's migration lock from start to end, so runs from
        several instances (up or down) take turns, each starting where the last one left.
down    reverts ONE migration unless told otherwise. Reverting drops tables, and with them
        the dedupe records: messages redelivered afterwards are applied again.
print   prints the SQL for teams that apply migrations with their own tool (goose, atlas,
        flyway); the schema name is quoted in, and each migration writes (up) or deletes
        (down) its row in the version table as migrate up and down do, so every command
        sees what was applied. Apply it in one transaction (psql -1 -v ON_ERROR_STOP=1).
        Needs no database. Without -from/-to it prints every migration (up) or reverts all
        (-down).
baseline records migrations 1 to N as applied, without running them, in a schema that has
        the tables but records no migration: one built from the printed SQL of an earlier
        release, which wrote no version rows. N is the last "-- NNN_name (up)" line of that
        SQL; migrate up then applies the rest.
version prints the applied version and the latest this binary knows, and what to run when
        the schema is behind or its version table lacks rows.`,
		examples: []string{
			"wmonce migrate up",
			"wmonce -schema payments migrate up -to 2",
			"wmonce migrate down -steps 1",
			"wmonce migrate print > wmonce.sql",
			"wmonce migrate print -down -from 4 -to 3",
			"psql -1 -v ON_ERROR_STOP=1 -f wmonce.sql",
			"wmonce migrate baseline 16",
			"wmonce migrate version",
		},
		actionRequired: "say what to do: up, down, print, baseline or version",
		actions: []action{
			{name: "up", db: (*env).open, new: newMigrateUp},
			{name: "down", db: (*env).open, new: newMigrateDown},
			{name: "print", new: newMigratePrint},
			{name: "baseline", args: true, db: (*env).open, new: newMigrateBaseline},
			{name: "version", db: (*env).open, new: report(operate.ReadSchemaStatus, (*env).printVersion)},
		},
	}
}

// migrateRun is `wmonce migrate up` or `down`: the direction and its options.
type migrateRun struct {
	dir   migrate.Direction
	opts  migrate.Opts
	all   bool
	given func(name string) bool // whether a flag was given
}

func newMigrateUp(fs *flag.FlagSet) runner {
	m := &migrateRun{dir: migrate.DirectionUp}
	fs.IntVar(&m.opts.TargetVersion, "to", 0, "last version to apply (default: latest)")
	return m
}

func newMigrateDown(fs *flag.FlagSet) runner {
	m := &migrateRun{dir: migrate.DirectionDown, given: func(name string) bool { return isSet(fs, name) }}
	fs.IntVar(&m.opts.MaxSteps, "steps", 0, "how many migrations to revert (default 1)")
	fs.BoolVar(&m.all, "all", false, "revert every migration (drops every table)")
	fs.IntVar(&m.opts.TargetVersion, "to", 0, "version to leave in place")
	return m
}

func (m *migrateRun) check([]string) error {
	if m.dir == migrate.DirectionUp {
		return usageIf(m.opts.TargetVersion < 0 || m.opts.TargetVersion > migrate.Latest(), "-to must be between 1 and %d (the latest version)", migrate.Latest())
	}
	err := operate.FirstError(
		usageIf(countTrue(m.given("steps"), m.all, m.given("to")) > 1, "give only one of -steps, -all and -to"),
		usageIf(m.given("steps") && m.opts.MaxSteps < 1, "-steps must be at least 1"),
		usageIf(m.opts.TargetVersion < 0 || m.opts.TargetVersion > migrate.Latest(), "-to must be between 0 and %d", migrate.Latest()))
	if m.all || m.given("to") {
		m.opts.MaxSteps = migrate.AllSteps // down to -to, or to 0
	}
	return err
}

func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// migratePrint is `wmonce migrate print`.
type migratePrint struct {
	down     bool
	from, to int
	dir      migrate.Direction
}

func newMigratePrint(fs *flag.FlagSet) runner {
	m := &migratePrint{}
	fs.BoolVar(&m.down, "down", false, "print the down migrations (newest first)")
	fs.IntVar(&m.from, "from", -1, "up: print migrations after this version (default 0); down: start from this version (default latest)")
	fs.IntVar(&m.to, "to", -1, "up: last version to print (default latest); down: version to leave in place (default 0)")
	return m
}

// check fills the versions left out (-1): up prints from 0 to the latest, down from the
// latest to 0; and checks the range goes the direction's way.
func (m *migratePrint) check([]string) error {
	latest := migrate.Latest()
	first, last := 0, latest
	m.dir = migrate.DirectionUp
	if m.down {
		m.dir, first, last = migrate.DirectionDown, latest, 0
	}
	m.from, m.to = orDefault(m.from, first), orDefault(m.to, last)
	return operate.FirstError(
		usageIf(m.from > latest || m.to > latest, "versions go from 0 to %d", latest),
		usageIf(m.down != (m.from > m.to) || m.from == m.to, "nothing to print between -from %d and -to %d (up needs from < to, down from > to)", m.from, m.to))
}

func (m *migratePrint) run(_ context.Context, e *env) error {
	sql, err := migrate.Print(e.g.schema, m.dir, m.from, m.to)
	if err != nil {
		return err
	}
	return show(e, map[string]any{"schema": e.g.schema, "direction": m.dir, "from": m.from, "to": m.to, "sql": sql}, func(map[string]any) { fmt.Fprint(e.stdout, sql) })
}

// orDefault is v, or def when v is unset (negative).
func orDefault(v, def int) int {
	if v < 0 {
		return def
	}
	return v
}

// migrateBaseline is `wmonce migrate baseline N`.
type migrateBaseline struct{ version int }

func newMigrateBaseline(*flag.FlagSet) runner { return &migrateBaseline{} }

func (m *migrateBaseline) check(rest []string) error {
	if len(rest) != 1 {
		return usagef("give the last version the schema's SQL held: migrate baseline N")
	}
	n, err := strconv.Atoi(rest[0])
	m.version = n
	return usageIf(err != nil || n < 1 || n > migrate.Latest(), "the version must be between 1 and %d, got %q", migrate.Latest(), rest[0])
}

func (m *migrateBaseline) run(ctx context.Context, e *env) error {
	mig, err := e.migrator()
	if err == nil {
		err = mig.Baseline(ctx, m.version)
	}
	if err != nil {
		return err
	}
	return show(e, map[string]any{"schema": e.g.schema, "recorded": m.version, "latest": migrate.Latest()}, func(map[string]any) {
		fmt.Fprintf(e.stdout, "schema %s: recorded migrations 1 to %d as applied (latest %d)\n", e.g.schema, m.version, migrate.Latest())
	})
}

// printVersion prints the schema's version and what to run when it is behind.
func (e *env) printVersion(s operate.SchemaStatus) {
	fmt.Fprintf(e.stdout, "schema %s: version %d (latest %d)\n", s.Schema, s.Version, s.Latest)
	if s.Hint != "" {
		fmt.Fprintln(e.stdout, s.Hint)
	}
}

// migrator migrates the schema; its logger tells on stderr when a run waits for another
// migration of the schema.
func (e *env) migrator() (*migrate.Migrator, error) {
	return migrate.New(e.db, migrate.Config{Schema: e.g.schema}, watermill.NewStdLoggerWithOut(e.stderr, false, false))
}

func (m *migrateRun) run(ctx context.Context, e *env) error {
	mig, err := e.migrator()
	if err != nil {
		return err
	}
	opts := m.opts
	res, err := mig.Migrate(ctx, m.dir, &opts)
	if err != nil {
		return err
	}
	// From and To were read under the migration lock: a Version call before or after could see
	// another run's work.
	done, err := migrationNames(res.Versions)
	if err != nil {
		return err
	}
	out := map[string]any{"schema": e.g.schema, "direction": m.dir, "from": res.From, "to": res.To, "migrations": done, "latest": migrate.Latest()}
	return show(e, out, func(map[string]any) { e.printMigrated(m.dir, res, done) })
}

// migrationNames names the versions as their files do (001_claims).
func migrationNames(versions []int) ([]string, error) {
	all, err := migrate.All()
	names := map[int]string{}
	for _, mig := range all {
		names[mig.Version] = fmt.Sprintf("%03d_%s", mig.Version, mig.Name)
	}
	done := make([]string, len(versions))
	for i, v := range versions {
		done[i] = names[v]
	}
	return done, err
}

func (e *env) printMigrated(dir migrate.Direction, res migrate.Result, done []string) {
	if len(done) == 0 {
		fmt.Fprintf(e.stdout, "schema %s: nothing to do, at version %d (latest %d)\n", e.g.schema, res.To, migrate.Latest())
		return
	}
	verb := map[migrate.Direction]string{migrate.DirectionUp: "applied", migrate.DirectionDown: "reverted"}[dir]
	fmt.Fprintf(e.stdout, "schema %s: %s %s; version %d -> %d (latest %d)\n", e.g.schema, verb, strings.Join(done, ", "), res.From, res.To, migrate.Latest())
}
