package outbox_test

import (
	"context"
	"database/sql"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// A restore into another cluster cannot be done cheaply in a unit test, but what it leaves is
// plain data: positions and row ids of a cluster whose counter was higher, and a different
// system identifier. simulateMove rewrites a schema to exactly that, as pg_restore into this
// cluster would have left it: the rows visible in the relay's position get ids below the
// source's snapshot, the others ids at or above it, and the position becomes the source's
// snapshot, its offset_high (what the source's sequence had allocated) kept.
func simulateMove(t *testing.T, db *sql.DB, schema, relay string, forwarded, pending []string) (source uint64) {
	t.Helper()
	var cur uint64
	require.NoError(t, db.QueryRow(`SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&cur))
	source = cur + 10_000_000 // the source's counter, far above this cluster's
	ob := pgtx.QualifiedName(schema, "outbox")
	for i, u := range forwarded {
		pgtest.Exec(t, db, `UPDATE `+ob+` SET transaction_id = $2::text::xid8 WHERE uuid = $1`, u, strconv.FormatUint(source-100+uint64(i), 10))
	}
	for i, u := range pending {
		pgtest.Exec(t, db, `UPDATE `+ob+` SET transaction_id = $2::text::xid8 WHERE uuid = $1`, u, strconv.FormatUint(source+5+uint64(i), 10))
	}
	snap := strconv.FormatUint(source, 10) + ":" + strconv.FormatUint(source, 10) + ":"
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "outbox_offsets")+` SET snapshot = $2::pg_snapshot, target_snapshot = NULL, target_offset = NULL,
    system_identifier = 4242 WHERE consumer_group = $1`, relay, snap)
	return source
}

func prunable(t *testing.T, db *sql.DB, schema string) (int64, error) {
	t.Helper()
	return outbox.Prune(context.Background(), db, schema, pgtx.PruneRequest{Before: time.Now().Add(time.Hour)})
}

// TestRestoreIntoALowerCounterIsDetectedAndRebasedWithNothingLost is the outbox side of issue
// 35: after a move into a cluster whose counter is lower, the relay forwarded nothing written
// after it, Stats hid those rows, and once the counter passed the source's, Prune deleted them.
func TestRestoreIntoALowerCounterIsDetectedAndRebasedWithNothingLost(t *testing.T) {
	db, schema, w := setup(t)
	ctx := context.Background()
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, DisableListen: true}, nil)
	require.NoError(t, err)

	publishTx(t, db, w, "t", "a1", "a2", "a3") // forwarded before the dump
	drain(t, r, s, 3)
	publishTx(t, db, w, "t", "b1", "b2") // in the outbox, not forwarded, at the dump
	simulateMove(t, db, schema, "relay", []string{"a1", "a2", "a3"}, []string{"b1", "b2"})
	publishTx(t, db, w, "t", "c1", "c2") // written after the restore: ids of this cluster

	rep, err := outboxops.CheckPositions(ctx, db, schema)
	require.NoError(t, err)
	require.Len(t, rep.Positions, 1)
	c := rep.Positions[0]
	require.True(t, c.Moved(), "%+v", c)
	require.True(t, c.Ahead, "the position is ahead of this cluster's counter")
	require.EqualValues(t, 2, c.HiddenRows, "c1 and c2 look older than the position")
	require.EqualValues(t, 5, c.FutureRows, "every restored row carries an id from the source")
	require.Equal(t, "4242", c.RecordedSystem)
	require.True(t, c.SystemChanged)
	require.ErrorIs(t, rep.Err(), outbox.ErrPositionsMoved)
	require.Contains(t, c.Finding(schema), "wmonce -schema "+schema+" rebase")

	stats, _, err := outbox.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.EqualValues(t, 4, stats[0].Backlog, "b1, b2 and the rows written after the restore are all waiting")
	require.True(t, stats[0].Moved != "")

	_, err = r.RelayOnce(ctx)
	require.ErrorIs(t, err, outbox.ErrPositionsMoved, "the relay forwards nothing from a moved position")
	require.Len(t, s.all(), 3)

	n, err := prunable(t, db, schema)
	require.ErrorIs(t, err, outbox.ErrPositionsMoved)
	require.Zero(t, n)
	require.Equal(t, 7, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")))

	res, err := outboxops.RebasePositions(ctx, db, schema)
	require.NoError(t, err)
	require.Equal(t, []string{"relay"}, res.Positions)
	require.EqualValues(t, 4, res.Republished, "b1, b2, c1, c2 are forwarded again")
	require.EqualValues(t, 3, res.Frozen, "a1..a3 were forwarded: kept forwarded")

	rep, err = outboxops.CheckPositions(ctx, db, schema)
	require.NoError(t, err)
	require.NoError(t, rep.Err(), "clean after the rebase")
	require.False(t, rep.Positions[0].SystemChanged)

	publishTx(t, db, w, "t", "d1") // written after the rebase
	drain(t, r, s, 8)
	require.Equal(t, []string{"t/a1", "t/a2", "t/a3", "t/b1", "t/b2", "t/c1", "t/c2", "t/d1"}, s.all(),
		"every event once, the unforwarded ones in insertion order")
	left, err := r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, left, "nothing left to forward")

	stats, _, err = outbox.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.Zero(t, stats[0].Backlog)
	require.False(t, stats[0].Moved != "")
	n, err = prunable(t, db, schema)
	require.NoError(t, err)
	require.EqualValues(t, 8, n, "every row is forwarded: all prunable")
}

// TestPruneNeverDeletesARowWrittenAfterTheRestore checks the retention rule on its own: a row
// written after the restore with an id that the restored position sees as published is kept,
// also when the only other finding (the position ahead) is gone because this cluster's counter
// has passed the source's and the system identifier is not readable.
func TestPruneNeverDeletesARowWrittenAfterTheRestore(t *testing.T) {
	db, schema, w := setup(t)
	ctx := context.Background()
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, DisableListen: true}, nil)
	require.NoError(t, err)
	publishTx(t, db, w, "t", "a1")
	drain(t, r, s, 1)
	// As the counter had passed the source's: the position is this cluster's current snapshot
	// (nothing ahead), the row written after the restore has an id below it, and no system
	// identifier was recorded.
	publishTx(t, db, w, "t", "c1")
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "outbox_offsets")+` SET snapshot = pg_current_snapshot(), system_identifier = NULL`)

	rep, err := outboxops.CheckPositions(ctx, db, schema)
	require.NoError(t, err)
	require.False(t, rep.Positions[0].Ahead)
	require.EqualValues(t, 1, rep.Positions[0].HiddenRows, "c1 was written after the position was recorded yet looks visible in it")
	n, err := prunable(t, db, schema)
	require.ErrorIs(t, err, outbox.ErrPositionsMoved)
	require.Zero(t, n)
	stats, _, err := outbox.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.EqualValues(t, 1, stats[0].Backlog, "c1 is waiting")
	require.Equal(t, 2, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")))
}

// TestRestoreIntoAHigherCounterNeedsNothing: a restore into a cluster whose counter is higher
// loses nothing today; only the system identifier changed, and the relay records it and goes
// on without republishing anything.
func TestRestoreIntoAHigherCounterNeedsNothing(t *testing.T) {
	db, schema, w := setup(t)
	ctx := context.Background()
	s := &sink{}
	logs := watermill.NewCaptureLogger()
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, DisableListen: true}, logs)
	require.NoError(t, err)
	publishTx(t, db, w, "t", "a1", "a2")
	drain(t, r, s, 2)
	publishTx(t, db, w, "t", "b1")
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	pgtest.Exec(t, db, `UPDATE `+offsets+` SET system_identifier = 4242`)

	rep, err := outboxops.CheckPositions(ctx, db, schema)
	require.NoError(t, err)
	require.True(t, rep.Positions[0].SystemChanged)
	require.False(t, rep.Positions[0].Moved(), "%+v", rep.Positions[0])
	res, err := outboxops.RebasePositions(ctx, db, schema)
	require.NoError(t, err)
	require.True(t, res.Rerecorded)
	require.Empty(t, res.Positions, "nothing to rebase")
	require.Zero(t, res.Republished)

	pgtest.Exec(t, db, `UPDATE `+offsets+` SET system_identifier = 4242`)
	drain(t, r, s, 3)
	require.Equal(t, []string{"t/a1", "t/a2", "t/b1"}, s.all(), "nothing redelivered, nothing lost")
	var recorded sql.NullString
	require.NoError(t, db.QueryRow(`SELECT system_identifier::text FROM `+offsets).Scan(&recorded))
	require.Equal(t, rep.SystemIdentifier, recorded.String, "the relay recorded this cluster's identifier")
	require.Empty(t, logs.Captured()[watermill.ErrorLogLevel])
	require.True(t, slices.ContainsFunc(logs.Captured()[watermill.InfoLogLevel], func(m watermill.CapturedMessage) bool {
		return m.Fields["recorded"] == "4242" && m.Fields["now"] == rep.SystemIdentifier
	}), "said at INFO")
}

// TestRunningRelayHaltsOnAMovedPositionAndResumesAfterTheRebase: the relay's Run loop checks
// its position when it starts leading, forwards nothing while it is moved, and goes on by
// itself once it is rebased.
func TestRunningRelayHaltsOnAMovedPositionAndResumesAfterTheRebase(t *testing.T) {
	db, schema, w := setup(t)
	ctx := context.Background()
	s := newKeyedSink(1)
	publishTx(t, db, w, "t", "a1")
	r0, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, DisableListen: true}, nil)
	require.NoError(t, err)
	drain(t, r0, s, 1)
	publishTx(t, db, w, "t", "b1")
	simulateMove(t, db, schema, "relay", []string{"a1"}, []string{"b1"})
	publishTx(t, db, w, "t", "c1")

	logs := watermill.NewCaptureLogger()
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, PollInterval: 50 * time.Millisecond}, logs)
	require.NoError(t, err)
	sig := outbox.RelaySignals(r)
	sig.Halted.Init()
	startRelay(t, r)
	halted := sig.Halted.WaitOrTimeout()
	require.True(t, halted.Ahead)
	require.True(t, r.Counters().Moved)
	sig.Halted.WaitOrTimeout() // checked again (every 5s): still halted, logged once a minute
	require.Equal(t, []string{"a1"}, s.all(), "nothing forwarded while halted")
	var halts []watermill.CapturedMessage
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		if m.Msg == "Relay halted: its position is not of this cluster" {
			halts = append(halts, m)
		}
	}
	require.Len(t, halts, 1, "logged at ERROR at once, then once a minute")
	require.ErrorIs(t, halts[0].Err, outbox.ErrPositionsMoved)
	require.Equal(t, "wmonce -schema "+schema+" rebase", halts[0].Fields["run"])

	done := s.expect(3)
	_, err = outboxops.RebasePositions(ctx, db, schema)
	require.NoError(t, err)
	testwait.Closed(t, done, "the halted relay forwarding after the rebase (it checks again every 5s)")
	require.Equal(t, []string{"a1", "b1", "c1"}, s.all())
	require.False(t, r.Counters().Moved)
}

// TestMoveWithoutTheSequenceIsDetectedAndRebased: logical replication copies rows but not
// sequence values, so on the new cluster the outbox's offsets start again from 1 and rows
// written there take offsets the position counts as forwarded. The check reports the sequence
// behind the position; the rebase republishes every row whose offset the new sequence may have
// given (nothing lost; copies of forwarded rows are the consumers' to absorb) and moves the
// sequence on.
func TestMoveWithoutTheSequenceIsDetectedAndRebased(t *testing.T) {
	db, schema, w := setup(t)
	ctx := context.Background()
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, DisableListen: true}, nil)
	require.NoError(t, err)
	publishTx(t, db, w, "t", "a1", "a2", "a3")
	drain(t, r, s, 3)
	pgtest.Exec(t, db, `SELECT setval(pg_get_serial_sequence('`+pgtx.QualifiedName(schema, "outbox")+`', 'offset'), 1, false)`)
	publishTx(t, db, w, "t", "c1") // offset 1 again, on the new cluster
	// As it is once this cluster's counter has passed the source's: c1's id is visible in the
	// position, and its offset is below the position's offset_high; only the system
	// identifier differs. Without the sequence check c1 would count as forwarded: never
	// published, and pruned.
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "outbox_offsets")+` SET snapshot = pg_current_snapshot(), system_identifier = 4242`)

	rep, err := outboxops.CheckPositions(ctx, db, schema)
	require.NoError(t, err)
	require.True(t, rep.Positions[0].SequenceBehind, "%+v", rep.Positions[0])
	require.ErrorIs(t, rep.Err(), outbox.ErrPositionsMoved)
	_, err = r.RelayOnce(ctx)
	require.ErrorIs(t, err, outbox.ErrPositionsMoved)
	n, err := prunable(t, db, schema)
	require.ErrorIs(t, err, outbox.ErrPositionsMoved)
	require.Zero(t, n)

	res, err := outboxops.RebasePositions(ctx, db, schema)
	require.NoError(t, err)
	require.EqualValues(t, 2, res.Republished, "c1, and a1, whose offset c1 shares")
	rep, err = outboxops.CheckPositions(ctx, db, schema)
	require.NoError(t, err)
	require.NoError(t, rep.Err())
	publishTx(t, db, w, "t", "d1")
	drain(t, r, s, 6)
	require.ElementsMatch(t, []string{"t/a1", "t/a2", "t/a3", "t/a1", "t/c1", "t/d1"}, s.all())
	left, err := r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, left)
}
