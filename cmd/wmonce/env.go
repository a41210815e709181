package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/pgtx"
)

// globals are the flags every command accepts, before or after its name.
type globals struct {
	databaseURL string
	schema      string
	json        bool
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.databaseURL, "database-url", g.databaseURL, "PostgreSQL URL (default: $DATABASE_URL, else "+pgtx.DefaultDatabaseURL+")")
	fs.StringVar(&g.schema, "schema", g.schema, "schema holding watermill-once's tables")
	fs.BoolVar(&g.json, "json", g.json, "print JSON instead of text")
}

// env is what a command runs with.
type env struct {
	g      globals
	stdout io.Writer
	stderr io.Writer
	cmd    *command
	db     *sql.DB
}

// open connects to PostgreSQL, turning the usual failures into instructions.
func (e *env) open(ctx context.Context) (*sql.DB, error) {
	if e.db != nil {
		return e.db, nil
	}
	if _, err := pgx.ParseConfig(e.g.databaseURL); err != nil {
		return nil, fmt.Errorf("cannot parse the database URL: %w\n  fix: pass -database-url (or set DATABASE_URL) as postgres://user:password@host:5432/dbname?sslmode=disable", err)
	}
	db, err := pgtx.Open(ctx, e.g.databaseURL, pgtx.PoolConfig{MaxOpenConns: 4}) // a command needs few connections
	if err != nil {
		switch pgtx.SQLState(err) {
		case "28P01", "28000":
			return nil, fmt.Errorf("%w\n  fix: check the user and password in -database-url / DATABASE_URL", err)
		case "3D000":
			return nil, fmt.Errorf("%w\n  fix: create the database (createdb NAME) or name an existing one in -database-url / DATABASE_URL", err)
		}
		return nil, fmt.Errorf("%w\n  fix: start PostgreSQL there, or point -database-url (or DATABASE_URL) at a running server", err)
	}
	e.db = db
	return db, nil
}

// openMigrated connects and checks that the schema has tables: version 0 is an error that
// says to migrate, an older version a warning.
func (e *env) openMigrated(ctx context.Context) (*sql.DB, error) {
	db, err := e.open(ctx)
	if err != nil {
		return nil, err
	}
	s, err := operate.ReadSchemaStatus(ctx, db, e.g.schema)
	if err != nil {
		return nil, err
	}
	if s.Version == 0 {
		return nil, errors.New(s.Hint)
	}
	if s.Hint != "" {
		fmt.Fprintf(e.stderr, "warning: %s\n", s.Hint)
	}
	return db, nil
}

// explain adds what to do to errors an operator can fix, and makes a request the admin
// operations refused as input (operate.IsInputError) a usage error (exit 2).
func (e *env) explain(err error) error {
	if err == nil {
		return nil
	}
	if operate.IsInputError(err) {
		return usagef("%v", err)
	}
	if pgtx.IsUndefinedTable(err) {
		return fmt.Errorf("%w\n  fix: schema %s lacks this table: run `wmonce -schema %s migrate up`", err, e.g.schema, e.g.schema)
	}
	return err
}

// show prints v as JSON under -json, else as text.
func show[T any](e *env, v T, text func(T)) error {
	if e.g.json {
		return e.printJSON(v)
	}
	text(v)
	return nil
}

// report is an action that reads one report and shows it; it takes no flags of its own.
func report[T any](read func(context.Context, *sql.DB, string) (T, error), text func(e *env, v T)) func(*flag.FlagSet) runner {
	return func(*flag.FlagSet) runner { return reportRunner[T]{read, text} }
}

type reportRunner[T any] struct {
	read func(context.Context, *sql.DB, string) (T, error)
	text func(e *env, v T)
}

func (r reportRunner[T]) run(ctx context.Context, e *env) error {
	v, err := r.read(ctx, e.db, e.g.schema)
	if err != nil {
		return err
	}
	return show(e, v, func(v T) { r.text(e, v) })
}

func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (e *env) table() *tabwriter.Writer {
	return tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
}
