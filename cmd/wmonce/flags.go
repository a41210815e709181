package main

import (
	"errors"
	"flag"
	"io"
	"strconv"
	"strings"

	"github.com/wmonce/watermill-once/pgtx"
)

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

// noArgs refuses positional arguments a command does not take (often a flag typed after one).
func noArgs(args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q (flags go before positional arguments, and every value needs its flag)", args[0])
	}
	return nil
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

// parseIDs reads the values of flag, positive integers naming what (nil when none).
func parseIDs(values []string, flag, what string) ([]int64, error) {
	var out []int64
	for _, v := range values {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id < 1 {
			return nil, usagef("%s takes positive %s, got %q", flag, what, v)
		}
		out = append(out, id)
	}
	return out, nil
}

// isSet reports whether the flag was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

// usageIf is a usage error saying what format says when bad holds, else nil: the checks of a
// command line, listed in the order operate.FirstError reads them.
func usageIf(bad bool, format string, args ...any) error {
	if bad {
		return usagef(format, args...)
	}
	return nil
}

// required is a usage error saying msg when the flag's value is blank.
func required(value, msg string) error {
	return usageIf(strings.TrimSpace(value) == "", "%s", msg)
}
