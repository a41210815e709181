// Package setup holds the first steps of the components' constructors, so that every
// constructor refuses a nil database, fills in and checks its configuration, and defaults its
// logger the same way, and the rules for text, names and dedupe keys that every component
// applies (text.go). It is a leaf: it imports nothing of this module.
package setup

import (
	"cmp"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
)

// Config fills in config's defaults with setDefaults and then validates it; a validation error
// is returned wrapped after invalid (e.g. "outbox: invalid config"). setDefaults is usually a
// method expression such as (*Config).setDefaults.
func Config[C interface{ Validate() error }](config *C, setDefaults func(*C), invalid string) error {
	setDefaults(config)
	if err := (*config).Validate(); err != nil {
		return fmt.Errorf("%s: %w", invalid, err)
	}
	return nil
}

// Component is the start of a constructor that takes a database, a configuration and a logger:
// it refuses a nil db with the error text nilDB, runs Config, and returns logger, or a no-op
// logger when logger is nil. The checks run in that order, so a nil db is reported first.
func Component[C interface{ Validate() error }](db *sql.DB, nilDB string, config *C, setDefaults func(*C), invalid string, logger watermill.LoggerAdapter) (watermill.LoggerAdapter, error) {
	if db == nil {
		return nil, errors.New(nilDB)
	}
	if err := Config(config, setDefaults, invalid); err != nil {
		return nil, err
	}
	return Logger(logger), nil
}

// Logger returns logger, or a no-op logger when it is nil.
func Logger(logger watermill.LoggerAdapter) watermill.LoggerAdapter {
	if logger == nil {
		return watermill.NopLogger{}
	}
	return logger
}

// Between returns nil when lo <= v <= hi, else an error that names field and says the range
// and the value: one phrasing for every range check of every Config.
func Between[T cmp.Ordered](field string, v, lo, hi T) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s must be between %v and %v, got %v", field, lo, hi, v)
	}
	return nil
}

// AtLeast returns nil when v >= lo, else an error that names field and says the bound and the
// value.
func AtLeast[T cmp.Ordered](field string, v, lo T) error {
	if v < lo {
		return fmt.Errorf("%s must be at least %v, got %v", field, lo, v)
	}
	return nil
}

// NotNegative returns nil when v >= 0, else an error that names field and says the value.
func NotNegative[T cmp.Ordered](field string, v T) error {
	var zero T
	if v < zero {
		return fmt.Errorf("%s must not be negative, got %v", field, v)
	}
	return nil
}

// Positive returns nil when v > 0, else an error that names field and says the value.
func Positive[T cmp.Ordered](field string, v T) error {
	var zero T
	if v <= zero {
		return fmt.Errorf("%s must be positive, got %v", field, v)
	}
	return nil
}

// Check returns nil when ok, else the error format and args describe: a rule of a Validate
// function that the range helpers do not express, written as one item of its list of checks.
func Check(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// Each runs check on every value and joins the errors it returns (nil when there are none):
// the per-item rule of a list field (method names, slots, header names).
func Each[T any](values []T, check func(T) error) error {
	errs := make([]error, 0, len(values))
	for _, v := range values {
		errs = append(errs, check(v))
	}
	return errors.Join(errs...)
}
