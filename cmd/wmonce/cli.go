package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/wmonce/watermill-once/pgtx"
)

// The CLI's frame: the commands, and run, which parses the global flags, dispatches to a
// command and turns its error into a message and an exit code.

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	exitUnknown = 3 // doctor: no hazard found, but a source could not be checked
)

// command is one `wmonce <name>`: its help, and its actions.
type command struct {
	name     string
	summary  string
	usage    string // synopsis lines after "wmonce "
	details  string
	examples []string
	// actions are those of a command with several (`wmonce inbox list`), the first being the
	// one run when none is named; a command without actions has one, unnamed.
	actions []action
	// actionRequired, when set, is the usage error for a command line that names no action
	// (instead of running the first).
	actionRequired string
}

// action is one action of a command: what it needs, and its flags and run (new).
type action struct {
	name    string
	aliases []string
	// args says the action takes positional arguments; without, any is a usage error.
	args bool
	// db opens the database before run ((*env).open, or (*env).openMigrated, which also
	// checks the schema has tables); nil for an action that needs none.
	db func(e *env, ctx context.Context) (*sql.DB, error)
	// new registers the action's flags on fs and returns what runs with them.
	new func(fs *flag.FlagSet) runner
}

// runner is an action with its flags parsed: run works with e.db, opened as the action says.
type runner interface {
	run(ctx context.Context, e *env) error
}

// checker is a runner that checks its flags and positional arguments before the database is
// opened, so that a mistake in the command line is a usage error without one.
type checker interface {
	check(args []string) error
}

func commands() []*command {
	return []*command{migrateCommand(), statusCommand(), inboxCommand(), outboxCommand(), failuresCommand(), connectorCommand(), dedupeCommand(), purgeCommand(), adminCommand(), doctorCommand(),
		pauseCommand(), resumeCommand(), rebaseCommand()}
}

func findCommand(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// uncheckedError is a command that could not check everything it was asked to and found
// nothing wrong in the rest: exit code 3, so that a CI gate does not read "could not check"
// as "safe".
type uncheckedError struct{ msg string }

func (e *uncheckedError) Error() string { return e.msg }

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
		return runHelp(rest, stdout, stderr)
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
	return exitStatus(c, c.runWith(ctx, e, rest), stdout, stderr)
}

// runHelp is `wmonce help [command]`.
func runHelp(rest []string, stdout, stderr io.Writer) int {
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

// exitStatus reports c's error, if any, and returns the exit status it means.
func exitStatus(c *command, err error, stdout, stderr io.Writer) int {
	var ue *usageError
	var unchecked *uncheckedError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		printCommandHelp(stdout, c)
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "wmonce %s: %s\nRun `wmonce help %s` for usage and examples.\n", c.name, ue.msg, c.name)
		return exitUsage
	case errors.As(err, &unchecked):
		fmt.Fprintf(stderr, "wmonce %s: %v\n", c.name, err)
		return exitUnknown
	default:
		fmt.Fprintf(stderr, "wmonce %s: %v\n", c.name, err)
		return exitFailure
	}
}

func (c *command) runWith(ctx context.Context, e *env, args []string) error {
	if c.actions[0].name == "" {
		return e.runAction(ctx, c.actions[0], c.name, args)
	}
	if c.actionRequired != "" && (len(args) == 0 || strings.HasPrefix(args[0], "-") && !isHelp(args[0])) {
		return usagef("%s", c.actionRequired)
	}
	a, args, err := c.findAction(args)
	if err != nil {
		return err
	}
	return e.runAction(ctx, a, c.name+" "+a.name, args)
}

func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// findAction finds the action args name (or the first one), refusing an unknown one with the
// list and a suggestion; it returns the arguments that follow the name.
func (c *command) findAction(args []string) (action, []string, error) {
	name := c.actions[0].name
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	names := make([]string, len(c.actions))
	for i, a := range c.actions {
		names[i] = a.name
		if a.name == name || slices.Contains(a.aliases, name) {
			return a, args, nil
		}
	}
	list := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	return action{}, nil, usagef("unknown %s action %q: use %s%s", c.name, name, list, suggestFrom(name, names...))
}

// runAction parses a's flags (with the global ones) and arguments, checks them, opens the
// database if a needs it, and runs a. An error the operator can fix says how (explain).
func (e *env) runAction(ctx context.Context, a action, name string, args []string) error {
	fs := e.flags(name)
	r := a.new(fs)
	rest, err := e.parse(fs, args)
	if err == nil {
		err = checkArgs(a, r, rest)
	}
	if err == nil && a.db != nil {
		_, err = a.db(e, ctx)
	}
	if err == nil {
		err = r.run(ctx, e)
	}
	return e.explain(err)
}

// checkArgs refuses positional arguments an action does not take, then runs its own checks.
func checkArgs(a action, r runner, args []string) error {
	if !a.args {
		if err := noArgs(args); err != nil {
			return err
		}
	}
	if c, ok := r.(checker); ok {
		return c.check(args)
	}
	return nil
}

func suggestFrom(name string, options ...string) string {
	for _, o := range options {
		if editDistance(name, o) <= 2 {
			return fmt.Sprintf(" (did you mean %q?)", o)
		}
	}
	return ""
}
