package once_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

func occurred(uuid string, at time.Time, payload string) *message.Message {
	msg := message.NewMessage(uuid, []byte(payload))
	msg.Metadata.Set(outbox.MetadataOccurredAt, at.UTC().Format(time.RFC3339Nano))
	return msg
}

func TestLookupClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	_, err := e.mw.Middleware(e.effect)(message.NewMessage("e-1", []byte("p")))
	require.NoError(t, err)
	c, found, err := once.LookupClaim(context.Background(), e.db, e.schema, "c", "e-1")
	require.NoError(t, err)
	require.True(t, found)
	require.Len(t, c.PayloadSHA256, 32)
	require.WithinDuration(t, time.Now(), c.ProcessedAt, time.Minute)
	_, found, err = once.LookupClaim(context.Background(), e.db, e.schema, "other", "e-1")
	require.NoError(t, err)
	require.False(t, found)
	_, _, err = once.LookupClaim(context.Background(), e.db, e.schema, "c", "e-\x001")
	require.ErrorIs(t, err, wmonce.ErrInvalidKey)
	require.ErrorContains(t, err, "key must not contain NUL bytes")
	_, _, err = once.LookupClaim(context.Background(), e.db, e.schema, "c\xff", "e-1")
	require.ErrorContains(t, err, "consumer must be valid UTF-8")

	daily := newEnv(t, once.Config{Consumer: "c", PartitionByDay: true})
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	_, err = daily.mw.Middleware(daily.effect)(occurred("e-2", at, "p"))
	require.NoError(t, err)
	c, found, err = once.LookupClaim(context.Background(), daily.db, daily.schema, "c", "e-2")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, partition.Day(at), c.OccurredOn.UTC())
}

// The attempt guard of migration 010 at the SQL level: a COMMIT is refused while an attempt is
// open or after the transaction was doomed, allowed once every attempt ended (released, or
// rolled back with its savepoint), and leaves no guard row behind. Rows written the old way
// (one per attempt, deleted when it ends) are still checked, so older binaries keep their
// guarantee on a migrated schema.
func TestAttemptGuardRefusesACommitWhileAnAttemptIsOpenOrDoomed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	guard := e.table("attempt_guard")
	begin := `SELECT ` + e.table("attempt_begin") + `()`
	closed := `SET LOCAL wmonce.` + pgtx.QuoteIdentifier("attempt_"+e.schema) + ` = 'closed'`
	ctx := context.Background()
	run := func(stmts ...string) error {
		t.Helper()
		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for _, s := range stmts {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				_ = tx.Rollback()
				return err
			}
		}
		return tx.Commit()
	}
	refused := func(err error) {
		t.Helper()
		require.Error(t, err)
		require.Contains(t, err.Error(), "refusing to commit")
	}

	// Attempts that ended: three in one transaction, one guard row for all, gone at COMMIT.
	attempt := []string{"SAVEPOINT wmonce_attempt", begin, closed, "RELEASE SAVEPOINT wmonce_attempt"}
	require.NoError(t, run(append(append(slices.Clone(attempt), attempt...), attempt...)...))
	// A rolled-back attempt takes its state and its guard row with it.
	require.NoError(t, run("SAVEPOINT wmonce_attempt", begin, "ROLLBACK TO SAVEPOINT wmonce_attempt", "RELEASE SAVEPOINT wmonce_attempt"))
	require.NoError(t, run(append(slices.Clone(attempt), "SAVEPOINT wmonce_attempt", begin, "ROLLBACK TO SAVEPOINT wmonce_attempt", "RELEASE SAVEPOINT wmonce_attempt")...))
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+guard), "no guard row outlives its transaction")

	// An attempt still open at COMMIT, first or after others that ended.
	refused(run("SAVEPOINT wmonce_attempt", begin))
	refused(run(append(slices.Clone(attempt), "SAVEPOINT wmonce_attempt", begin)...))

	// A doomed transaction: its COMMIT fails, and no later attempt can open in it.
	refused(run(append(slices.Clone(attempt), `SELECT `+e.table("attempt_doom")+`()`)...))
	err := run(`SELECT `+e.table("attempt_doom")+`()`, "SAVEPOINT wmonce_attempt", begin)
	require.Equal(t, "WM001", pgtx.SQLState(err), "%v", err)

	// The protocol before migration 010: a row per attempt, deleted when the attempt ends.
	row := `INSERT INTO ` + guard + ` (xid) VALUES (pg_current_xact_id())`
	refused(run(row))
	require.NoError(t, run(row, `DELETE FROM `+guard+` WHERE xid = pg_current_xact_id()`))
	require.Zero(t, pgtest.Count(t, e.db, `SELECT count(*) FROM `+guard))
}

// On a pool from pgtx.Open (lazy BEGIN) the attempt guard is the connection's (txguard.For):
// the server's guard is never opened, so it costs the server nothing, and a handler's COMMIT is
// refused all the same, on the own-transaction path and in a group. On another pool the
// server's guard does it.
func TestAttemptGuardOnTheWireLeavesTheServerGuardClosed(t *testing.T) {
	t.Parallel()
	for name, lazy := range map[string]bool{"wire": true, "server": false} {
		for path, gc := range map[string]once.GroupCommitConfig{"own-tx": {Disabled: true}, "group": {Workers: 1}} {
			t.Run(name+"/"+path, func(t *testing.T) {
				t.Parallel()
				e, _ := countedEnv(t, lazy)
				mw, err := once.New(e.db, once.Config{Schema: e.schema, Consumer: "c", GroupCommit: gc}, nil)
				require.NoError(t, err)
				t.Cleanup(func() { _ = mw.Close() })
				state := "wmonce.attempt_" + e.schema // as migration 010 reads it
				var seen string
				h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
					tx, _ := pgtx.TxFromContext(msg.Context())
					if err := tx.QueryRowContext(msg.Context(), `SELECT coalesce(current_setting($1, true), '')`, state).Scan(&seen); err != nil {
						return nil, err
					}
					if _, err := e.effect(msg); err != nil {
						return nil, err
					}
					if msg.UUID == "commits" {
						_ = tx.Commit()
					}
					return nil, nil
				})
				_, err = h(message.NewMessage("fine", []byte("p")))
				require.NoError(t, err)
				if lazy {
					require.Empty(t, seen, "the server's guard was not opened")
				} else {
					require.Equal(t, "open", seen)
				}
				_, err = h(message.NewMessage("commits", []byte("p")))
				require.ErrorIs(t, err, wmonce.ErrHandlerEndedTx)
				require.Equal(t, 1, e.effects(t), "the handler's COMMIT was refused: nothing of it applied")
				require.Equal(t, 1, e.claims(t))
			})
		}
	}
}
