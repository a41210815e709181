package pgtx_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

func TestIdentifiers(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"wmonce", "_x", "a1_b2", "user"} {
		require.NoError(t, pgtx.ValidateIdentifier("schema", ok))
	}
	for _, bad := range []string{"", "A", "1a", "a-b", "a b", `a"b`, "ä", "a;drop"} {
		require.Error(t, pgtx.ValidateIdentifier("schema", bad), bad)
	}
	require.Equal(t, `"user"`, pgtx.QuoteIdentifier("user"))
	require.Equal(t, `"s"."t"`, pgtx.QualifiedName("s", "t"))
}

func TestRunInTxRetriesSerializationFailures(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	table := pgtx.QualifiedName(schema, "counter")
	pgtest.Exec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY, v int NOT NULL)`)
	pgtest.Exec(t, db, `INSERT INTO `+table+` VALUES (1, 0)`)

	var attempts atomic.Int32
	var ready sync.WaitGroup
	ready.Add(2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := pgtx.RunInTx(context.Background(), db, &sql.TxOptions{Isolation: sql.LevelSerializable}, pgtx.RetryPolicy{MaxAttempts: 5},
				func(ctx context.Context, tx *sql.Tx) error {
					got, ok := pgtx.TxFromContext(ctx)
					require.True(t, ok)
					require.Same(t, tx, got)
					var v int
					if err := tx.QueryRowContext(ctx, `SELECT v FROM `+table+` WHERE id = 1`).Scan(&v); err != nil {
						return err
					}
					if attempts.Add(1) <= 2 {
						ready.Done()
						ready.Wait()
					}
					_, err := tx.ExecContext(ctx, `UPDATE `+table+` SET v = $1 WHERE id = 1`, v+1)
					return err
				})
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	require.Equal(t, 2, pgtest.Count(t, db, `SELECT v FROM `+table))
	require.Equal(t, int32(3), attempts.Load(), "exactly one re-run")
}

func TestRunInTxDoesNotRetryOtherErrorsAndRollsBack(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	table := pgtx.QualifiedName(schema, "t")
	pgtest.Exec(t, db, `CREATE TABLE `+table+` (id int PRIMARY KEY)`)
	var attempts int
	boom := errors.New("boom")
	err := pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		attempts++
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES (1)`); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, 1, attempts)
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+table))

	// A unique violation is classified, not retried.
	pgtest.Exec(t, db, `INSERT INTO `+table+` VALUES (1)`)
	_, err = db.Exec(`INSERT INTO ` + table + ` VALUES (1)`)
	require.True(t, pgtx.IsUniqueViolation(err))
	require.False(t, pgtx.IsRetryableTx(err))
	require.Equal(t, "23505", pgtx.SQLState(err))
	_, err = db.Exec(`SELECT * FROM ` + pgtx.QualifiedName(schema, "missing"))
	require.True(t, pgtx.IsUndefinedTable(err))
}

func TestOpenRefusesBadInput(t *testing.T) {
	t.Parallel()
	_, err := pgtx.Open(context.Background(), "", pgtx.PoolConfig{})
	require.ErrorContains(t, err, "DATABASE_URL")
	_, err = pgtx.Open(context.Background(), "::not a url::", pgtx.PoolConfig{})
	require.ErrorContains(t, err, "cannot parse")
	_, err = pgtx.Open(context.Background(), pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 2, MaxIdleConns: 5})
	require.ErrorContains(t, err, "MaxIdleConns")
}
