package once_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// Two handlers read one counter, both having read before either writes, and each writes back
// what it read plus one, with the middleware's defaults. Under READ COMMITTED the second write
// overwrites the first (the counter ends at 1); under the default REPEATABLE READ it fails with
// a serialization failure, its transaction runs again on a fresh snapshot and both count.
func TestReadModifyWriteHandlerCountsEveryUpdateWithDefaults(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]once.Config{
		"per-message": {Consumer: "c", GroupCommit: once.GroupCommitConfig{Disabled: true}},
		// One message per group: two messages in one transaction run one after the other and
		// could not both read before either writes.
		"group-commit": {Consumer: "c", GroupCommit: once.GroupCommitConfig{TxBatchSize: 1}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, cfg)
			t.Cleanup(func() { _ = e.mw.Close() })
			counter := e.table("counter")
			pgtest.Exec(t, e.db, `CREATE TABLE `+counter+` (id int PRIMARY KEY, v int NOT NULL); INSERT INTO `+counter+` VALUES (1, 0)`)
			var bothRead sync.WaitGroup
			bothRead.Add(2)
			var attempts atomic.Int32
			h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				tx, _ := pgtx.TxFromContext(msg.Context())
				var v int
				if err := tx.QueryRowContext(msg.Context(), `SELECT v FROM `+counter+` WHERE id = 1`).Scan(&v); err != nil {
					return nil, err
				}
				if attempts.Add(1) <= 2 {
					bothRead.Done()
					bothRead.Wait()
				}
				_, err := tx.ExecContext(msg.Context(), `UPDATE `+counter+` SET v = $1 WHERE id = 1`, v+1)
				return nil, err
			})
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for i, id := range []string{"a", "b"} {
				wg.Go(func() { errs[i] = deliver(h, id, "p") })
			}
			wg.Wait()
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			require.Equal(t, 2, pgtest.Count(t, e.db, `SELECT v FROM `+counter), "both increments count")
			require.Equal(t, uint64(1), e.mw.Counters().Consumer("c").TxRetries, "the second writer ran again")
		})
	}
}

// A transaction that keeps failing with a serialization failure runs the default 10
// times before the error goes back to the router (the Stack's Retry, then a nack): three left a
// few percent of the messages of eight handlers on one row to the Stack.
func TestTxRetryDefaultAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c", TxRetry: pgtx.RetryPolicy{Backoff: time.Microsecond}})
	var runs atomic.Int32
	h := e.mw.Middleware(func(*message.Message) ([]*message.Message, error) {
		runs.Add(1)
		return nil, &pgconn.PgError{Code: pgtx.CodeSerializationFailure, Message: "test: lost a race"}
	})
	err := deliver(h, "a", "p")
	require.True(t, pgtx.IsSerializationFailure(err), "the last attempt's error is returned: %v", err)
	require.Equal(t, int32(10), runs.Load(), "Config.TxRetry documents 10 attempts by default")
	require.Zero(t, e.claims(t), "no claim is left behind")
}
