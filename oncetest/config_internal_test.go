package oncetest

import (
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/middleware/once"
)

// TxOptions in the Middleware adjustment that fail every transaction are a configuration
// error named at New, like the middleware's own (issue 34, item 3), not a violation report in
// each mode.
func TestConfigRefusesTxOptionsThatCannotWork(t *testing.T) {
	for want, opts := range map[string]*sql.TxOptions{
		"Middleware's TxOptions.ReadOnly must be false": {ReadOnly: true},
		"Middleware's TxOptions.Isolation must be":      {Isolation: sql.LevelLinearizable},
	} {
		err := Config{Middleware: func(c *once.Config) { c.TxOptions = opts }}.validate()
		require.ErrorContains(t, err, want)
	}
	err := Config{Middleware: func(c *once.Config) { c.TxOptions = &sql.TxOptions{Isolation: sql.LevelSerializable} }}.validate()
	require.NotContains(t, err.Error(), "TxOptions")
}
