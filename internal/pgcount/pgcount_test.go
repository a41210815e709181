package pgcount_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgcount"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TestCountsQueries checks the wire counter against statements whose round trips are known:
// a transaction of BEGIN, two statements and COMMIT is four queries once the statements are
// prepared (the first use of each also sends a Parse/Describe round: one query more).
func TestCountsQueries(t *testing.T) {
	pgtest.SkipShort(t)
	ctx := context.Background()
	var c pgcount.Counter
	db, err := pgcount.Open(ctx, pgtest.URL(), 1, &c, nil)
	require.NoError(t, err)
	defer db.Close()
	run := func() int64 {
		before := c.Count()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		var n int
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT $1::int`, 7).Scan(&n))
		_, err = tx.ExecContext(ctx, `SELECT 1`)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		return c.Count() - before
	}
	require.Equal(t, int64(6), run(), "first run: two statements prepared")
	require.Equal(t, int64(4), run(), "second run: prepared statements reused")
}
