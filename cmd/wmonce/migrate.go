package main

import (
	"context"
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
			{name: "up", run: migrateUp},
			{name: "down", run: migrateDown},
			{name: "print", run: migratePrint},
			{name: "baseline", run: migrateBaseline},
			{name: "version", run: migrateVersion},
		},
	}
}

func migrateUp(e *env, ctx context.Context, args []string) error {
	fs := e.flags("migrate up")
	to := fs.Int("to", 0, "last version to apply (default: latest)")
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return err
	}
	if *to < 0 || *to > migrate.Latest() {
		return usagef("-to must be between 1 and %d (the latest version)", migrate.Latest())
	}
	return e.migrate(ctx, migrate.DirectionUp, &migrate.Opts{TargetVersion: *to})
}

func migrateDown(e *env, ctx context.Context, args []string) error {
	fs := e.flags("migrate down")
	steps := fs.Int("steps", 0, "how many migrations to revert (default 1)")
	all := fs.Bool("all", false, "revert every migration (drops every table)")
	to := fs.Int("to", 0, "version to leave in place")
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return err
	}
	opts := &migrate.Opts{TargetVersion: *to, MaxSteps: *steps}
	set := 0
	for _, name := range []string{"steps", "all", "to"} {
		if isSet(fs, name) {
			set++
		}
	}
	switch {
	case set > 1:
		return usagef("give only one of -steps, -all and -to")
	case *steps < 0 || (*steps == 0 && isSet(fs, "steps")):
		return usagef("-steps must be at least 1")
	case *to < 0 || *to > migrate.Latest():
		return usagef("-to must be between 0 and %d", migrate.Latest())
	case *all:
		opts.MaxSteps = migrate.AllSteps
	case isSet(fs, "to"):
		opts.MaxSteps = migrate.AllSteps
	}
	return e.migrate(ctx, migrate.DirectionDown, opts)
}

func migratePrint(e *env, ctx context.Context, args []string) error {
	fs := e.flags("migrate print")
	down := fs.Bool("down", false, "print the down migrations (newest first)")
	from := fs.Int("from", -1, "up: print migrations after this version (default 0); down: start from this version (default latest)")
	to := fs.Int("to", -1, "up: last version to print (default latest); down: version to leave in place (default 0)")
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return err
	}
	dir, err := printRange(*down, from, to)
	if err != nil {
		return err
	}
	sql, err := migrate.Print(e.g.schema, dir, *from, *to)
	if err != nil {
		return err
	}
	if e.g.json {
		return e.printJSON(map[string]any{"schema": e.g.schema, "direction": dir, "from": *from, "to": *to, "sql": sql})
	}
	_, err = fmt.Fprint(e.stdout, sql)
	return err
}

// printRange fills the versions `migrate print` leaves out (-1): up prints from 0 to the
// latest, down from the latest to 0; and checks the range goes the direction's way.
func printRange(down bool, from, to *int) (migrate.Direction, error) {
	latest := migrate.Latest()
	dir, first, last := migrate.DirectionUp, 0, latest
	if down {
		dir, first, last = migrate.DirectionDown, latest, 0
	}
	*from, *to = orDefault(*from, first), orDefault(*to, last)
	if *from > latest || *to > latest {
		return dir, usagef("versions go from 0 to %d", latest)
	}
	if (!down && *from >= *to) || (down && *from <= *to) {
		return dir, usagef("nothing to print between -from %d and -to %d (up needs from < to, down from > to)", *from, *to)
	}
	return dir, nil
}

// orDefault is v, or def when v is unset (negative).
func orDefault(v, def int) int {
	if v < 0 {
		return def
	}
	return v
}

func migrateBaseline(e *env, ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("give the last version the schema's SQL held: migrate baseline N")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 || n > migrate.Latest() {
		return usagef("the version must be between 1 and %d, got %q", migrate.Latest(), args[0])
	}
	if err := e.parseFlagsOnly(e.flags("migrate baseline"), args[1:]); err != nil {
		return err
	}
	db, err := e.open(ctx)
	if err != nil {
		return err
	}
	m, err := migrate.New(db, migrate.Config{Schema: e.g.schema}, watermill.NewStdLoggerWithOut(e.stderr, false, false))
	if err != nil {
		return err
	}
	if err := m.Baseline(ctx, n); err != nil {
		return err
	}
	if e.g.json {
		return e.printJSON(map[string]any{"schema": e.g.schema, "recorded": n, "latest": migrate.Latest()})
	}
	fmt.Fprintf(e.stdout, "schema %s: recorded migrations 1 to %d as applied (latest %d)\n", e.g.schema, n, migrate.Latest())
	return nil
}

func migrateVersion(e *env, ctx context.Context, args []string) error {
	if err := e.parseFlagsOnly(e.flags("migrate version"), args); err != nil {
		return err
	}
	db, err := e.open(ctx)
	if err != nil {
		return err
	}
	s, err := operate.ReadSchemaStatus(ctx, db, e.g.schema)
	if err != nil {
		return err
	}
	if e.g.json {
		return e.printJSON(s)
	}
	fmt.Fprintf(e.stdout, "schema %s: version %d (latest %d)\n", s.Schema, s.Version, s.Latest)
	if s.Hint != "" {
		fmt.Fprintln(e.stdout, s.Hint)
	}
	return nil
}

func (e *env) migrate(ctx context.Context, dir migrate.Direction, opts *migrate.Opts) error {
	db, err := e.open(ctx)
	if err != nil {
		return err
	}
	// The logger tells on stderr when this run waits for another migration of the schema.
	m, err := migrate.New(db, migrate.Config{Schema: e.g.schema}, watermill.NewStdLoggerWithOut(e.stderr, false, false))
	if err != nil {
		return err
	}
	res, err := m.Migrate(ctx, dir, opts)
	if err != nil {
		return err
	}
	// Read under the migration lock: a Version call before or after could see another run's work.
	before, after := res.From, res.To
	names := map[int]string{}
	all, err := migrate.All()
	if err != nil {
		return err
	}
	for _, mig := range all {
		names[mig.Version] = fmt.Sprintf("%03d_%s", mig.Version, mig.Name)
	}
	if e.g.json {
		done := make([]string, len(res.Versions))
		for i, v := range res.Versions {
			done[i] = names[v]
		}
		return e.printJSON(map[string]any{"schema": e.g.schema, "direction": dir, "from": before, "to": after, "migrations": done, "latest": migrate.Latest()})
	}
	if len(res.Versions) == 0 {
		fmt.Fprintf(e.stdout, "schema %s: nothing to do, at version %d (latest %d)\n", e.g.schema, after, migrate.Latest())
		return nil
	}
	verb := "applied"
	if dir == migrate.DirectionDown {
		verb = "reverted"
	}
	done := make([]string, len(res.Versions))
	for i, v := range res.Versions {
		done[i] = names[v]
	}
	fmt.Fprintf(e.stdout, "schema %s: %s %s; version %d -> %d (latest %d)\n", e.g.schema, verb, strings.Join(done, ", "), before, after, migrate.Latest())
	return nil
}
