package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/pgtx"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// command is one `wmonce <name>`.
type command struct {
	name     string
	summary  string
	usage    string // synopsis lines after "wmonce "
	details  string
	examples []string
	run      func(ctx context.Context, e *env, args []string) error
}

func commands() []*command {
	return []*command{migrateCommand(), statusCommand(), inboxCommand(), outboxCommand(), dedupeCommand(), purgeCommand(), adminCommand()}
}

func findCommand(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

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

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := globals{databaseURL: os.Getenv("DATABASE_URL"), schema: pgtx.DefaultSchema}
	if g.databaseURL == "" {
		g.databaseURL = pgtx.DefaultDatabaseURL
	}
	top := flag.NewFlagSet("wmonce", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	g.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(stdout)
			return exitOK
		}
		fmt.Fprintf(stderr, "wmonce: %v\nRun `wmonce help` for usage.\n", err)
		return exitUsage
	}
	rest := top.Args()
	if len(rest) == 0 {
		printHelp(stderr)
		return exitUsage
	}
	name, rest := rest[0], rest[1:]
	if name == "help" || name == "-h" || name == "--help" {
		if len(rest) == 0 {
			printHelp(stdout)
			return exitOK
		}
		c := findCommand(rest[0])
		if c == nil {
			fmt.Fprintf(stderr, "wmonce: unknown command %q%s\nRun `wmonce help` for the list.\n", rest[0], suggest(rest[0]))
			return exitUsage
		}
		printCommandHelp(stdout, c)
		return exitOK
	}
	c := findCommand(name)
	if c == nil {
		fmt.Fprintf(stderr, "wmonce: unknown command %q%s\nRun `wmonce help` for the list.\n", name, suggest(name))
		return exitUsage
	}
	e := &env{g: g, stdout: stdout, stderr: stderr, cmd: c}
	defer func() {
		if e.db != nil {
			_ = e.db.Close()
		}
	}()
	err := c.run(ctx, e, rest)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		printCommandHelp(stdout, c)
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "wmonce %s: %s\nRun `wmonce help %s` for usage and examples.\n", c.name, ue.msg, c.name)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "wmonce %s: %v\n", c.name, err)
		return exitFailure
	}
}

// flags returns a flag set for the command (or one of its subcommands) with the global flags
// registered, so they may follow the command name too.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	e.g.register(fs)
	return fs
}

// parse parses args; positional arguments are returned. Errors are usage errors.
// Flags may come before and after positional arguments ("inspect 12 -json").
func (e *env) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usagef("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
	if err := pgtx.ValidateIdentifier("schema", e.g.schema); err != nil {
		return nil, usagef("-schema: %v", err)
	}
	return positional, nil
}

// parseFlagsOnly parses args for a command that takes flags only.
func (e *env) parseFlagsOnly(fs *flag.FlagSet, args []string) error {
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	return noArgs(rest)
}

// noArgs refuses positional arguments a command does not take (often a flag typed after one).
func noArgs(args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q (flags go before positional arguments, and every value needs its flag)", args[0])
	}
	return nil
}

// open connects to PostgreSQL, turning the usual failures into instructions.
func (e *env) open(ctx context.Context) (*sql.DB, error) {
	if e.db != nil {
		return e.db, nil
	}
	if _, err := pgx.ParseConfig(e.g.databaseURL); err != nil {
		return nil, fmt.Errorf("cannot parse the database URL: %w\n  fix: pass -database-url (or set DATABASE_URL) as postgres://user:password@host:5432/dbname?sslmode=disable", err)
	}
	db, err := pgtx.Open(ctx, e.g.databaseURL, pgtx.PoolConfig{MaxOpenConns: 4, PingTimeout: 5 * time.Second})
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

// parseAndOpen parses the flags of a command that takes no positional arguments and opens the
// migrated database (openMigrated).
func (e *env) parseAndOpen(ctx context.Context, fs *flag.FlagSet, args []string) (*sql.DB, error) {
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return nil, err
	}
	return e.openMigrated(ctx)
}

// openMigrated connects and checks that the schema has tables: version 0 is an error that
// says to migrate, an older version a warning.
func (e *env) openMigrated(ctx context.Context) (*sql.DB, error) {
	db, err := e.open(ctx)
	if err != nil {
		return nil, err
	}
	s, err := admin.ReadSchemaStatus(ctx, db, e.g.schema)
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

// explain adds what to do to errors an operator can fix.
func (e *env) explain(err error) error {
	if err == nil {
		return nil
	}
	if pgtx.IsUndefinedTable(err) {
		return fmt.Errorf("%w\n  fix: schema %s lacks this table: run `wmonce -schema %s migrate up`", err, e.g.schema, e.g.schema)
	}
	return err
}

func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (e *env) table() *tabwriter.Writer {
	return tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
}

func printHelp(w io.Writer) {
	fmt.Fprint(w, `wmonce: operate watermill-once (effectively-once message handling on PostgreSQL)

Usage:
  wmonce [-database-url URL] [-schema NAME] [-json] <command> [flags]

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	fmt.Fprintf(tw, "  help [command]\texplain a command, with examples\n")
	_ = tw.Flush()
	fmt.Fprintf(w, `
Global flags (before or after the command):
  -database-url URL  PostgreSQL to use. Default: $DATABASE_URL, else
                     %s
  -schema NAME       schema holding watermill-once's tables (default %s)
  -json              machine-readable output

Exit codes: 0 success, 1 failure (the message says what to fix), 2 usage error.

Examples:
  wmonce migrate up
  wmonce status
  wmonce inbox list -consumer rewards -status FAILED
  wmonce inbox replay -consumer rewards -dry-run
  wmonce dedupe -consumer rewards -message 5f0c0d5e-...
  wmonce -json outbox
`, pgtx.DefaultDatabaseURL, pgtx.DefaultSchema)
}

func printCommandHelp(w io.Writer, c *command) {
	fmt.Fprintf(w, "wmonce %s: %s\n\nUsage:\n", c.name, c.summary)
	for _, line := range strings.Split(strings.TrimSpace(c.usage), "\n") {
		fmt.Fprintf(w, "  wmonce %s\n", strings.TrimSpace(line))
	}
	if c.details != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.details))
	}
	if len(c.examples) > 0 {
		fmt.Fprintf(w, "\nExamples:\n")
		for _, ex := range c.examples {
			fmt.Fprintf(w, "  %s\n", ex)
		}
	}
	fmt.Fprintf(w, "\nGlobal flags -database-url, -schema and -json work here too (see `wmonce help`).\n")
}

// suggest returns ` (did you mean "x"?)` for a near miss.
func suggest(name string) string {
	best, bestDist := "", 3
	for _, c := range append(commands(), &command{name: "help"}) {
		if d := editDistance(name, c.name); d < bestDist {
			best, bestDist = c.name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// listFlag collects a flag given several times; with split, also comma-separated values.
type listFlag struct {
	values []string
	split  bool
}

func (l *listFlag) String() string { return strings.Join(l.values, ",") }

func (l *listFlag) Set(v string) error {
	if !l.split {
		l.values = append(l.values, v)
		return nil
	}
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			l.values = append(l.values, p)
		}
	}
	return nil
}

func parseIDs(values []string) ([]int64, error) {
	out := make([]int64, 0, len(values))
	for _, v := range values {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id < 1 {
			return nil, usagef("-id takes positive inbox row ids, got %q", v)
		}
		out = append(out, id)
	}
	return out, nil
}

// whenSet is when for a time that may be unset (nil).
func whenSet(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return when(*t)
}

// when formats a time with its age, e.g. "2026-03-01 10:00:00 UTC (3m12s ago)".
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	age := time.Since(t).Round(time.Second)
	s := t.Local().Format("2006-01-02 15:04:05 MST")
	if age >= 0 {
		return fmt.Sprintf("%s (%s ago)", s, age)
	}
	return s
}

func seconds(s float64) string {
	if s <= 0 {
		return "-"
	}
	d := time.Duration(s * float64(time.Second))
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// isSet reports whether the flag was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

// shellQuote quotes s for a command line an operator copies, when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r == ':' || r == '/' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
