package pgtx_test

import (
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/pgtx"
)

// Options that fail every transaction a component begins are refused by the one check every
// Config uses, with the field named; the levels PostgreSQL has pass.
func TestCheckTxOptions(t *testing.T) {
	t.Parallel()
	for _, ok := range []*sql.TxOptions{nil, {}, {Isolation: sql.LevelReadUncommitted}, {Isolation: sql.LevelReadCommitted},
		{Isolation: sql.LevelRepeatableRead}, {Isolation: sql.LevelSerializable}} {
		require.NoError(t, pgtx.CheckTxOptions("TxOptions", ok), "%+v", ok)
	}
	for want, bad := range map[string]*sql.TxOptions{
		"TxOptions.ReadOnly must be false":        {ReadOnly: true},
		"got Linearizable, which PostgreSQL does": {Isolation: sql.LevelLinearizable},
		"got Write Committed":                     {Isolation: sql.LevelWriteCommitted},
		"PostgreSQL has no SNAPSHOT level":        {Isolation: sql.LevelSnapshot},
		"got IsolationLevel(42)":                  {Isolation: 42},
	} {
		require.ErrorContains(t, pgtx.CheckTxOptions("TxOptions", bad), want)
	}
}
