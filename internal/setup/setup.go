// Package setup holds the first steps of the components' constructors, so that every
// constructor refuses a nil database, fills in and checks its configuration, and defaults its
// logger the same way. It is a leaf: it imports nothing of this module.
package setup

import (
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
