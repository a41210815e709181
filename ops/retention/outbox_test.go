package retention_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/relaytest"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// publishOutbox stores n messages through the outbox writer, one transaction each.
func publishOutbox(t *testing.T, db *sql.DB, schema string, n int) {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	for i := range n {
		tx, err := db.Begin()
		require.NoError(t, err)
		require.NoError(t, w.PublishTx(context.Background(), tx, "events", message.NewMessage(fmt.Sprintf("m-%d", i), []byte(`{}`))))
		require.NoError(t, tx.Commit())
	}
}

// relayed runs a relay named name one row at a time until it has forwarded want rows. The rows
// were committed before, so every call forwards one until they are all out.
func relayed(t *testing.T, db *sql.DB, schema, name string, want int) *outbox.Relay {
	t.Helper()
	pub := gochannel.NewGoChannel(gochannel.Config{}, logger())
	t.Cleanup(func() { _ = pub.Close() })
	r, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema, Name: name, BatchSize: 1}, logger())
	require.NoError(t, err)
	relaytest.RunUntil(t, r, fmt.Sprintf("forward %d rows (relay %s)", want, name), 1, func(c outbox.RelayCounters) bool { return int(c.Forwarded) >= want })
	return r
}

func TestOutboxRowsDeletedOnlyWhenOldAndForwardedByEveryRelay(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ob := pgtx.QualifiedName(schema, "outbox")
	ctx := context.Background()
	j := newJanitor(t, db, retention.Config{Schema: schema, OutboxKeep: day, BatchSize: 2})

	publishOutbox(t, db, schema, 10)
	// Every row is two days old: only the relays' positions hold them back now.
	pgtest.Exec(t, db, `UPDATE `+ob+` SET created_at = created_at - interval '2 days'`)

	// No relay has ever run: nothing is known to be forwarded, nothing goes.
	rep, err := j.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.OutboxRows)

	relayed(t, db, schema, "kafka", 10)
	relayed(t, db, schema, "audit", 3)
	rep, err = j.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), rep.OutboxRows, "only rows the slowest relay forwarded")
	require.Equal(t, 7, pgtest.Count(t, db, `SELECT count(*) FROM `+ob))
	require.Equal(t, 0, pgtest.Count(t, db, `SELECT count(*) FROM `+ob+` WHERE uuid IN ('m-0', 'm-1', 'm-2')`))

	// Young rows that every relay forwarded stay for OutboxKeep.
	pgtest.Exec(t, db, `UPDATE `+ob+` SET created_at = localtimestamp WHERE uuid IN ('m-5', 'm-6', 'm-7', 'm-8', 'm-9')`)
	relayed(t, db, schema, "audit", 7) // the rest: the slowest relay is now level with the other
	rep, err = j.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), rep.OutboxRows)
	require.Equal(t, 5, pgtest.Count(t, db, `SELECT count(*) FROM `+ob))

	// A retired relay blocks cleanup until it is forgotten.
	pgtest.Exec(t, db, `UPDATE `+ob+` SET created_at = created_at - interval '2 days'`)
	pgtest.Exec(t, db, `INSERT INTO `+pgtx.QualifiedName(schema, "outbox_offsets")+` (consumer_group, offset_acked, last_processed_transaction_id) VALUES ('retired', 0, '0')`)
	rep, err = j.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.OutboxRows)
	relays, _, err := outbox.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.Len(t, relays, 3)
	require.Equal(t, "retired", relays[2].Name)
	found, err := outbox.ForgetRelay(ctx, db, schema, "retired")
	require.NoError(t, err)
	require.True(t, found)
	rep, err = j.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), rep.OutboxRows)
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+ob))
	require.Equal(t, uint64(10), j.Counters().OutboxRows)
}

// An outbox read by Debezium: the janitor advances the slot's position first, so a round
// deletes the old rows the slot confirmed and keeps the rest; the slot need not be listed in
// CDCSlots. A slot that is gone, or a listed one without a position, fails its step, saying so.
func TestOutboxRowsDeletedOnceTheSlotConfirmedThem(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ob := pgtx.QualifiedName(schema, "outbox")
	ctx := context.Background()
	slot := pgtest.LogicalSlot(t, db)
	_, err := outboxops.RegisterSlotPosition(ctx, db, schema, slot)
	require.NoError(t, err)
	j := newJanitor(t, db, retention.Config{Schema: schema, OutboxKeep: day, BatchSize: 2}) // found, not listed

	publishOutbox(t, db, schema, 5)
	pgtest.Exec(t, db, `UPDATE `+ob+` SET created_at = created_at - interval '2 days'`)
	rep, err := j.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.OutboxRows, "the slot has confirmed nothing")

	// The slot confirms past the rows. A position trails the slot by up to two rounds (a round
	// moves it to the mark the slot has confirmed and takes the next mark), and which round
	// that is depends on whether anything wrote WAL between the slot's creation and the
	// registration's mark (on a quiet server the slot has confirmed that mark at once): two
	// confirmed rounds delete every row, whichever of them does it.
	var deleted int64
	for range 2 {
		pgtest.ConfirmSlot(t, db, slot)
		rep, err = j.RunOnce(ctx)
		require.NoError(t, err)
		deleted += rep.OutboxRows
	}
	require.Equal(t, int64(5), deleted)
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+ob))

	_, err = retention.NewJanitor(db, retention.Config{Schema: schema, CDCSlots: []string{"Bad Slot"}}, nil)
	require.ErrorContains(t, err, "CDCSlots[0]")
	listed := newJanitor(t, db, retention.Config{Schema: schema, CDCSlots: []string{slot, "wmonce_unregistered_slot"}})
	_, err = listed.RunOnce(ctx)
	require.ErrorIs(t, err, outboxops.ErrSlotPositionNotRegistered)
	require.ErrorContains(t, err, "wmonce_unregistered_slot")
	_, err = outboxops.RegisterSlotPosition(ctx, db, schema, "wmonce_no_such_slot")
	require.NoError(t, err)
	_, err = j.RunOnce(ctx)
	require.ErrorIs(t, err, outboxops.ErrSlotMissing)
	slots, err := outboxops.SlotPositions(ctx, db, schema)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{slot, "wmonce_no_such_slot"}, slots)
}
