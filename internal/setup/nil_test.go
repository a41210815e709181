package setup_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/setup"
)

func TestIsNil(t *testing.T) {
	t.Parallel()
	var tx *sql.Tx //nolint:staticcheck // SA4023, see below
	var execer interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	} = tx
	require.True(t, execer != nil, //nolint:staticcheck // SA4023: always true, which is the trap this test shows
		"the trap: an interface holding a nil pointer is not nil")
	require.True(t, setup.IsNil(execer))
	require.True(t, setup.IsNil(nil))
	require.False(t, setup.IsNil(pgtest.DB(t)))
	require.False(t, setup.IsNil(0))
}
