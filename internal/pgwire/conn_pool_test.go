package pgwire_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/pgwire"
	"github.com/wmonce/watermill-once/pgtx"
)

func openCounted(t *testing.T, lazy bool) (*sql.DB, *pgtx.RoundTripCounter) {
	t.Helper()
	pgtest.SkipShort(t)
	rt := &pgtx.RoundTripCounter{}
	db, err := pgtx.Open(context.Background(), pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 1, DisableLazyBegin: !lazy, RoundTrips: rt})
	require.NoError(t, err, "these tests need PostgreSQL: start it or set DATABASE_URL")
	t.Cleanup(func() { _ = db.Close() })
	return db, rt
}

// Lazy BEGIN saves exactly one round trip per transaction, whatever the first statement is
// and however pgx sends it, and the transaction is the same: atomic, isolated, rolled back.
func TestLazyBeginSavesARoundTripAndKeepsTheTransaction(t *testing.T) {
	t.Parallel()
	shared := pgtest.DB(t)
	table := pgtx.QualifiedName(pgtest.Schema(t, shared), "t")
	pgtest.Exec(t, shared, `CREATE TABLE `+table+` (k text PRIMARY KEY)`)
	ctx := context.Background()

	firsts := map[string]func(tx *sql.Tx, k string) error{
		"extended exec": func(tx *sql.Tx, k string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ($1)`, k)
			return err
		},
		"simple protocol": func(tx *sql.Tx, k string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ($1)`, pgx.QueryExecModeSimpleProtocol, k)
			return err
		},
		"no arguments": func(tx *sql.Tx, k string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ('`+k+`')`)
			return err
		},
		"unnamed statement": func(tx *sql.Tx, k string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ($1)`, pgx.QueryExecModeDescribeExec, k)
			return err
		},
		"query": func(tx *sql.Tx, k string) error {
			var got string
			return tx.QueryRowContext(ctx, `INSERT INTO `+table+` VALUES ($1) RETURNING k`, k).Scan(&got)
		},
	}
	for name, first := range firsts {
		perTx := map[bool]int64{}
		for _, lazy := range []bool{false, true} {
			db, rt := openCounted(t, lazy)
			run := func(k string, commit bool) {
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
				require.NoError(t, err)
				require.NoError(t, first(tx, k), name)
				var inTx bool
				require.NoError(t, tx.QueryRowContext(ctx, `SELECT pg_current_xact_id_if_assigned() IS NOT NULL`).Scan(&inTx))
				require.True(t, inTx, "%s: the statement ran inside the transaction", name)
				if commit {
					require.NoError(t, tx.Commit())
				} else {
					require.NoError(t, tx.Rollback())
				}
			}
			run(name+"-warm", true) // statement cache
			before := rt.Load()
			run(name+"-a", true)
			perTx[lazy] = rt.Load() - before
			run(name+"-rolled-back", false)
			require.Equal(t, 0, pgtest.Count(t, shared, `SELECT count(*) FROM `+table+` WHERE k = $1`, name+"-rolled-back"), "%s (lazy %v): rollback undid the write", name, lazy)
			require.Equal(t, 1, pgtest.Count(t, shared, `SELECT count(*) FROM `+table+` WHERE k = $1`, name+"-a"))
			pgtest.Exec(t, shared, `DELETE FROM `+table)
		}
		require.Equal(t, int64(1), perTx[false]-perTx[true], "%s: BEGIN travels with the first statement (%v)", name, perTx)
		if name != "unnamed statement" { // that mode describes each statement first: one round trip more
			require.Equal(t, int64(3), perTx[true], "%s: statement, check, COMMIT", name)
		}
	}
}

// A failing first statement fails inside the transaction: the transaction is aborted (not
// autocommitted), the error is the statement's, and the connection is reusable.
func TestLazyBeginFirstStatementError(t *testing.T) {
	t.Parallel()
	shared := pgtest.DB(t)
	table := pgtx.QualifiedName(pgtest.Schema(t, shared), "t")
	pgtest.Exec(t, shared, `CREATE TABLE `+table+` (k text PRIMARY KEY)`)
	ctx := context.Background()
	db, _ := openCounted(t, true)

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES (NULL)`)
	require.Equal(t, "23502", pgtx.SQLState(err))
	_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ('x')`)
	require.Equal(t, pgtx.CodeInFailedTransaction, pgtx.SQLState(err), "still in the (aborted) transaction")
	require.NoError(t, tx.Rollback())

	// An empty transaction, and a read-only one refusing a write.
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	tx, err = db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable, ReadOnly: true})
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ($1)`, "ro")
	require.Equal(t, "25006", pgtx.SQLState(err))
	require.NoError(t, tx.Rollback())
	require.Equal(t, 0, pgtest.Count(t, db, `SELECT count(*) FROM `+table))
}

// Deferred statements cost no round trip, run before the next statement (COMMIT included) in
// order, and an error of theirs stops that statement: it never runs without them.
func TestDeferredStatements(t *testing.T) {
	t.Parallel()
	shared := pgtest.DB(t)
	table := pgtx.QualifiedName(pgtest.Schema(t, shared), "t")
	pgtest.Exec(t, shared, `CREATE TABLE `+table+` (k text PRIMARY KEY)`)
	ctx := context.Background()
	db, rt := openCounted(t, true)

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ($1)`, "a")
	require.NoError(t, err)
	before := rt.Load()
	_, err = tx.ExecContext(ctx, pgwire.DeferredPrefix+`INSERT INTO `+table+` VALUES ('b'); DELETE FROM `+table+` WHERE k = 'a'`)
	require.NoError(t, err)
	require.Equal(t, before, rt.Load(), "held back")
	var keys []string
	rows, err := tx.QueryContext(ctx, `SELECT k FROM `+table+` ORDER BY k`, pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"b"}, keys, "the deferred statements ran first, in order")
	require.Equal(t, before+1, rt.Load())
	_, err = tx.ExecContext(ctx, pgwire.DeferredPrefix+`INSERT INTO `+table+` VALUES ('c')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Equal(t, 2, pgtest.Count(t, shared, `SELECT count(*) FROM `+table), "COMMIT carried the last one")

	// A deferred statement that fails: the next statement (here the extended-protocol one)
	// reports its error and does not run; COMMIT cannot commit anything.
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ($1)`, "d")
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, pgwire.DeferredPrefix+`INSERT INTO `+table+` VALUES ('b')`) // duplicate key
	require.NoError(t, err, "the outcome is not known yet")
	_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ($1)`, "e")
	require.Equal(t, "23505", pgtx.SQLState(err))
	require.Error(t, tx.Commit())
	require.Equal(t, 2, pgtest.Count(t, shared, `SELECT count(*) FROM `+table))

	// Outside a transaction the prefix is only a comment: the statement runs at once.
	_, err = db.ExecContext(ctx, pgwire.DeferredPrefix+`INSERT INTO `+table+` VALUES ('f')`)
	require.NoError(t, err)
	require.Equal(t, 3, pgtest.Count(t, shared, `SELECT count(*) FROM `+table))
}
