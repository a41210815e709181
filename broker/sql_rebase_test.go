package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/sqlrebase"
	"github.com/wmonce/watermill-once/pgtx"
)

// sourceShift is how far ahead of this cluster a simulated source cluster's transaction ids are:
// adding it to every id of a topic table leaves the table as a logical restore into a cluster with
// a lower counter does (the probe: source near 970,000, target near 900).
const sourceShift = 1 << 40

// TestSQLRebaseAfterRestoreIntoLowerCounter: a topic whose ids are ahead of the cluster (group a
// acked 20 of 30 rows, group b 10; the first 5 rows kept ids below the new counter, as rows of
// a source's early transactions do; then 5 rows published after the "restore") delivers
// nothing, and the subscription says so at ERROR; after sqlrebase.Rebase each group receives
// exactly the rows it had not acked, in order, then what is published next, and a second rebase
// changes nothing. With a third group c that acked nothing ("late"), c reads every row.
func TestSQLRebaseAfterRestoreIntoLowerCounter(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, func(t *testing.T, version int) {
		for _, late := range []bool{false, true} {
			t.Run(fmt.Sprintf("late-group=%v", late), func(t *testing.T) {
				t.Parallel()
				testSQLRebaseAfterRestoreIntoLowerCounter(t, version, late)
			})
		}
	})
}

func testSQLRebaseAfterRestoreIntoLowerCounter(t *testing.T, version int, late bool) {
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	topic := pgtest.NewName("moved")
	cfg := sqlConfig(t, schema, version)
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "a"}, {Topic: topic, Group: "b"}}
	if late {
		cfg.Subscriptions = append(cfg.Subscriptions, broker.Subscription{Topic: topic, Group: "c"})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logs := watermill.NewCaptureLogger()
	b, err := broker.New(ctx, db, cfg, logs)
	require.NoError(t, err)
	defer b.Close()
	b.TestSignals().SQLMoveDetected.Init()
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	publish := func(ids ...string) {
		t.Helper()
		for _, id := range ids { // one transaction each: distinct ids, as in production
			require.NoError(t, pub.Publish(topic, message.NewMessage(id, []byte("x"))))
		}
	}
	names := func(prefix string, from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, fmt.Sprintf("%s-%d", prefix, i))
		}
		return out
	}
	messages := pgtx.QualifiedName(schema, "watermill_"+topic)
	offsets := pgtx.QualifiedName(schema, "watermill_offsets_"+topic)

	publish(names("m", 0, 30)...)
	// The groups' positions as watermill-sql acks them: the last row consumed.
	ackThrough := func(group string, n int) {
		pgtest.Exec(t, db, `UPDATE `+offsets+` o SET offset_acked = m."offset", last_processed_transaction_id = m.transaction_id
FROM (SELECT "offset", transaction_id FROM `+messages+` ORDER BY transaction_id, "offset" OFFSET $2 LIMIT 1) m WHERE o.consumer_group = $1`, group, n-1)
	}
	ackThrough("a", 20)
	ackThrough("b", 10)
	// The restore: ids and positions now the source cluster's, ahead of this one, but for the
	// first 5 rows (a source's early transactions, below this cluster's counter: only their
	// offsets tell them from rows published here). Group c never acked: its position stays 0.
	pgtest.Exec(t, db, `UPDATE `+messages+` SET transaction_id = (transaction_id::text::bigint + $1)::text::xid8
WHERE "offset" > (SELECT "offset" FROM `+messages+` ORDER BY transaction_id, "offset" OFFSET 4 LIMIT 1)`, int64(sourceShift))
	pgtest.Exec(t, db, `UPDATE `+offsets+` SET last_processed_transaction_id = (last_processed_transaction_id::text::bigint + $1)::text::xid8
WHERE last_processed_transaction_id <> '0'`, int64(sourceShift))
	publish(names("n", 0, 5)...) // after the restore: ids below every position

	moved, err := sqlrebase.Check(ctx, db, schema)
	require.NoError(t, err)
	require.Len(t, moved.Moved, 1, "the restored table is reported")
	require.Equal(t, sqlrebase.TopicMove{Topic: topic, FutureRows: 25, GroupsAhead: []string{"a", "b"}}, moved.Moved[0])
	require.ErrorIs(t, moved.Err(), broker.ErrSQLTopicsMoved)

	// Before the rebase: the subscription receives nothing and logs the move at ERROR.
	sub, err := b.NewSubscriber("a")
	require.NoError(t, err)
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	require.Equal(t, topic, b.TestSignals().SQLMoveDetected.WaitOrTimeout())
	require.True(t, logs.HasError(broker.ErrSQLTopicsMoved), "the move is logged at ERROR")
	select {
	case m := <-ch:
		t.Fatalf("a moved table delivered %s before the rebase; the probe saw nothing delivered", m.UUID)
	default:
	}
	require.NoError(t, sub.Close())

	report, err := sqlrebase.Rebase(ctx, db, schema)
	require.NoError(t, err)
	require.Len(t, report.Topics, 1)
	got := report.Topics[0]
	require.Equal(t, topic, got.Topic)
	rereads := map[string]int64{}
	for _, g := range got.Groups {
		rereads[g.Group] = g.Rereads
	}
	if late {
		// c acked nothing: every row is read again by someone, and none can stay frozen.
		require.EqualValues(t, 35, got.Republished)
		require.EqualValues(t, 0, got.Frozen)
		require.Equal(t, map[string]int64{"a": 15, "b": 25, "c": 35}, rereads)
	} else {
		require.EqualValues(t, 25, got.Republished, "rows 10-29 (not acked by b) and the 5 new ones")
		// Rows 5-9, acked by both groups; rows 0-4 keep their low ids unless the server's xmin
		// (held back by other tests' open transactions) is within a few ids of them, when they
		// are frozen too so that they stay below the new positions.
		require.True(t, got.Frozen >= 5 && got.Frozen <= 10, "frozen %d: rows 5-9, and 0-4 only if they sort among the new ids", got.Frozen)
		require.Equal(t, map[string]int64{"a": 15, "b": 25}, rereads)
	}

	again, err := sqlrebase.Rebase(ctx, db, schema)
	require.NoError(t, err)
	require.Empty(t, again.Topics, "a rebased schema has nothing to rebase")
	clean, err := sqlrebase.Check(ctx, db, schema)
	require.NoError(t, err)
	require.NoError(t, clean.Err())

	publish("end")
	want := map[string][]string{
		"a": append(append(names("m", 20, 30), names("n", 0, 5)...), "end"),
		"b": append(append(names("m", 10, 30), names("n", 0, 5)...), "end"),
	}
	if late {
		want["c"] = append(append(names("m", 0, 30), names("n", 0, 5)...), "end")
	}
	for group, want := range want {
		sub, err := b.NewSubscriber(group)
		require.NoError(t, err)
		ch, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		var ids []string
		for _, m := range receive(t, ch, len(want), 30*time.Second) {
			ids = append(ids, m.UUID)
		}
		require.Equal(t, want, ids, "group %s reads again exactly what it had not acked, in order", group)
		require.NoError(t, sub.Close())
	}
}

// TestSQLCheckTopicsQuietOnHealthyTables: a table written on this cluster only is not reported,
// and sqlrebase.Rebase leaves it alone (it would otherwise redeliver rows).
func TestSQLCheckTopicsQuietOnHealthyTables(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	topic := pgtest.NewName("healthy")
	cfg := sqlConfig(t, schema, 4)
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "a"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.New(ctx, db, cfg, watermill.NopLogger{})
	require.NoError(t, err)
	defer b.Close()
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("m-0", []byte("x"))))
	r, err := sqlrebase.Check(ctx, db, schema)
	require.NoError(t, err)
	require.NoError(t, r.Err())
	require.NotZero(t, r.NextXid)
	rb, err := sqlrebase.Rebase(ctx, db, schema)
	require.NoError(t, err)
	require.Empty(t, rb.Topics)
	_, err = sqlrebase.Check(ctx, db, "bad schema")
	require.ErrorContains(t, err, "schema")
}
