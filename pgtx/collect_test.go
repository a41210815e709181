package pgtx_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

func scanInt(s pgtx.Scanner) (int, error) {
	var n int
	err := s.Scan(&n)
	return n, err
}

func TestQueryAll(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()

	got, err := pgtx.QueryAll(ctx, db, scanInt, `SELECT g FROM generate_series(1, $1::int) g ORDER BY g`, 4)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3, 4}, got)

	got, err = pgtx.QueryAll(ctx, db, scanInt, `SELECT 1 WHERE false`)
	require.NoError(t, err)
	require.NotNil(t, got, "no rows is an empty slice, so it encodes as []")
	require.Empty(t, got)

	// A statement that fails after its first rows: the error reaches the caller, never a part
	// of the result.
	got, err = pgtx.QueryAll(ctx, db, scanInt, `SELECT 10 / (3 - g) FROM generate_series(1, 5) g`)
	require.ErrorContains(t, err, "division by zero")
	require.Nil(t, got)

	errScan := errors.New("refused")
	_, err = pgtx.QueryAll(ctx, db, func(s pgtx.Scanner) (int, error) {
		n, err := scanInt(s)
		if err == nil && n == 2 {
			err = errScan
		}
		return n, err
	}, `SELECT g FROM generate_series(1, 3) g ORDER BY g`)
	require.ErrorIs(t, err, errScan)

	// The same scan function reads a single row.
	n, err := scanInt(db.QueryRowContext(ctx, `SELECT 7`))
	require.NoError(t, err)
	require.Equal(t, 7, n)
}

func TestQueryEach(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()

	sums := map[bool]int{}
	require.NoError(t, pgtx.QueryEach(ctx, db, func(s pgtx.Scanner) error {
		n, err := scanInt(s)
		sums[n%2 == 0] += n
		return err
	}, `SELECT g FROM generate_series(1, 6) g`))
	require.Equal(t, map[bool]int{true: 12, false: 9}, sums)

	// The first error of each stops the rows.
	seen := 0
	errStop := errors.New("stop")
	err := pgtx.QueryEach(ctx, db, func(pgtx.Scanner) error {
		seen++
		return errStop
	}, `SELECT g FROM generate_series(1, 6) g`)
	require.ErrorIs(t, err, errStop)
	require.Equal(t, 1, seen)

	err = pgtx.QueryEach(ctx, db, func(s pgtx.Scanner) error { _, err := scanInt(s); return err },
		`SELECT 10 / (3 - g) FROM generate_series(1, 5) g`)
	require.ErrorContains(t, err, "division by zero")
}
