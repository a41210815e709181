package pgwire_test

import (
	"context"
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/pgwire"
	"github.com/wmonce/watermill-once/pgtx"
)

// Between WireGuardOpen and WireGuardClose a pool from Open refuses every way of committing the
// transaction: nothing of it is applied, the client gets the attempt guard's error where it
// asked for the commit, and the markers cost no round trip. After Close the library's own
// COMMIT goes through, and the guard ends with the transaction.
func TestWireGuardRefusesEveryCommit(t *testing.T) {
	t.Parallel()
	shared := pgtest.DB(t)
	table := pgtx.QualifiedName(pgtest.Schema(t, shared), "t")
	pgtest.Exec(t, shared, `CREATE TABLE `+table+` (k text PRIMARY KEY)`)
	ctx := context.Background()
	db, rt := openCounted(t, true)
	require.True(t, pgwire.Guards(db))

	commits := map[string]func(tx *sql.Tx) error{
		"tx.Commit":      func(tx *sql.Tx) error { return tx.Commit() },
		"COMMIT as text": func(tx *sql.Tx) error { _, err := tx.ExecContext(ctx, `COMMIT`); return err },
		"END as text":    func(tx *sql.Tx) error { _, err := tx.ExecContext(ctx, ` end work ;`); return err },
		"in a statement list": func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `SELECT 1; /* c */ CoMmIt AND NO CHAIN; SELECT 2`)
			return err
		},
		"prepare transaction": func(tx *sql.Tx) error { _, err := tx.ExecContext(ctx, `PREPARE TRANSACTION 'wmonce-test'`); return err },
		"ROLLBACK as text":    func(tx *sql.Tx) error { _, err := tx.ExecContext(ctx, `ROLLBACK`); return err },
		"abort as text":       func(tx *sql.Tx) error { _, err := tx.ExecContext(ctx, `abort`); return err },
		"rollback and chain":  func(tx *sql.Tx) error { _, err := tx.ExecContext(ctx, `rollback and chain`); return err },
		"prepared COMMIT": func(tx *sql.Tx) error {
			st, err := tx.PrepareContext(ctx, `COMMIT`)
			if err != nil {
				return err
			}
			defer st.Close()
			_, err = st.ExecContext(ctx)
			return err
		},
	}
	for name, commit := range commits {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, pgwire.GuardOpen)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ($1)`, name)
		require.NoError(t, err)
		err = commit(tx)
		require.True(t, pgtx.IsAttemptGuardRefusal(err), "%s: %v", name, err)
		if name == "tx.Commit" { // database/sql is done with the transaction: nothing follows
			require.Zero(t, pgtest.Count(t, shared, `SELECT count(*) FROM `+table+` WHERE k = '`+name+`'`))
			continue
		}
		// Refused, the transaction is over on the server: what follows is refused too, sending
		// nothing, instead of running in autocommit.
		_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ($1)`, name+"/after")
		require.True(t, pgtx.IsAttemptGuardRefusal(err), "%s, a later statement: %v", name, err)
		_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ('`+name+`/after, simple')`)
		require.True(t, pgtx.IsAttemptGuardRefusal(err), "%s, a later simple query: %v", name, err)
		_, err = tx.ExecContext(ctx, pgwire.GuardClose+`; COMMIT`)
		require.True(t, pgtx.IsAttemptGuardRefusal(err), "%s, a later COMMIT: %v", name, err)
		require.NoError(t, tx.Rollback(), "database/sql's own rollback goes through")
		require.Zero(t, pgtest.Count(t, shared, `SELECT count(*) FROM `+table+` WHERE k LIKE '`+name+`%'`), "%s: nothing applied", name)
		// The connection serves the pool as usual afterwards.
		_, err = db.ExecContext(ctx, `INSERT INTO `+table+` VALUES ($1)`, name+"/next")
		require.NoError(t, err)
	}

	// Closed: the commit goes through, and the markers were not sent.
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	before := rt.Load()
	_, err = tx.ExecContext(ctx, pgwire.GuardOpen)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ('closed') -- commit`)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, pgwire.GuardClose)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Equal(t, int64(2), rt.Load()-before, "BEGIN with the INSERT, COMMIT: the markers cost nothing")
	require.Equal(t, 1, pgtest.Count(t, shared, `SELECT count(*) FROM `+table+` WHERE k = 'closed'`))

	// A guard left open ends with its transaction: the next one commits as usual.
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, pgwire.GuardOpen)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ('next')`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Equal(t, 1, pgtest.Count(t, shared, `SELECT count(*) FROM `+table+` WHERE k = 'next'`))
}

// Only pools from Open with lazy BEGIN guard on the wire; callers use the server's guard on
// every other pool, where the markers reach the server as empty statements and change nothing.
func TestWireGuardsOnlyOnLazyBeginPools(t *testing.T) {
	t.Parallel()
	eager, _ := openCounted(t, false)
	require.False(t, pgwire.Guards(eager))
	require.False(t, pgwire.Guards(nil))
	other, err := sql.Open("pgx", pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	require.False(t, pgwire.Guards(other))
	tx, err := other.Begin()
	require.NoError(t, err)
	for _, marker := range []string{pgwire.GuardOpen, pgwire.GuardCheck, pgwire.GuardClose} {
		_, err := tx.Exec(marker)
		require.NoError(t, err, marker)
	}
	require.NoError(t, tx.Commit())
}
