package once_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// A handler in watermill-sql's subscriber transaction updates a row that another transaction
// changed after the subscriber's snapshot: 40001. Retrying in place keeps the snapshot and can
// never succeed; it used to be nacked and re-sent in the same transaction until AckDeadline.
// The transaction must instead be given up at once and the message redelivered in a new one,
// where it succeeds: two runs in all.
func TestSerializationFailureInSubscriberTxIsRedeliveredInANewTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{})
	pgtest.Exec(t, e.db, `CREATE TABLE `+e.table("balances")+` (id int PRIMARY KEY, n int NOT NULL)`)
	pgtest.Exec(t, e.db, `INSERT INTO `+e.table("balances")+` VALUES (1, 0)`)
	topic := "payments"
	pub, sub := sqlPubSubWithAckDeadline(t, e.db, e.schema, "rewards", 3*time.Second)

	var runs atomic.Int32
	handler := func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgtx.TxFromContext(msg.Context())
		if runs.Add(1) == 1 {
			// The subscriber took its snapshot before delivering; change the row after it.
			pgtest.Exec(t, e.db, `UPDATE `+e.table("balances")+` SET n = n + 100 WHERE id = 1`)
		}
		_, err := tx.ExecContext(msg.Context(), `UPDATE `+e.table("balances")+` SET n = n + 1 WHERE id = 1`)
		return nil, err
	}
	runRouter(t, "rewards", topic, sub, handler, e.mw.Middleware)
	acked := watchOffsets(t, e.db, e.schema).ackedOffsets(t, topic, "rewards")
	require.NoError(t, pub.Publish(topic, message.NewMessage("e-1", []byte(`{}`))))

	waitAcked(t, acked, 1)
	require.Equal(t, int32(2), runs.Load(), "one run under the stale snapshot, one in a new transaction")
	require.Equal(t, 101, pgtest.Count(t, e.db, `SELECT n FROM `+e.table("balances")+` WHERE id = 1`))
	require.Equal(t, 1, e.claims(t))
	require.Equal(t, once.Counters{Fresh: 1, Failed: 1, TxRetries: 1}, e.mw.Counters().Consumer("rewards"))
}
