package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// An outbox read through a replication slot (Debezium) has no Relay position: the slot's
// position lets Prune delete what the slot confirmed and nothing else. An unadvanced slot keeps
// everything, rows committed after the confirmed point are kept, a forgotten position no
// longer counts.
func TestPruneFollowsTheSlotPosition(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	ob := pgtx.QualifiedName(schema, "outbox")
	slot := pgtest.LogicalSlot(t, db)
	prune := func() int64 {
		t.Helper()
		pgtest.Exec(t, db, `UPDATE `+ob+` SET created_at = localtimestamp - interval '2 days'`)
		n, err := outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 1})
		require.NoError(t, err)
		return n
	}
	advance := func() bool {
		t.Helper()
		ok, err := outboxops.AdvanceSlotPosition(ctx, db, schema, slot)
		require.NoError(t, err)
		return ok
	}
	remaining := func() []string {
		t.Helper()
		rows, err := db.Query(`SELECT uuid FROM ` + ob + ` ORDER BY "offset"`)
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var u string
			require.NoError(t, rows.Scan(&u))
			out = append(out, u)
		}
		require.NoError(t, rows.Err())
		return out
	}

	_, err := outboxops.AdvanceSlotPosition(ctx, db, schema, slot)
	require.ErrorIs(t, err, outboxops.ErrSlotPositionNotRegistered)
	publishTx(t, db, w, "a", "before")
	registered, err := outboxops.RegisterSlotPosition(ctx, db, schema, slot)
	require.NoError(t, err)
	require.True(t, registered)
	registered, err = outboxops.RegisterSlotPosition(ctx, db, schema, slot)
	require.NoError(t, err)
	require.False(t, registered, "registering again keeps the position")
	publishTx(t, db, w, "a", "m-1", "m-2")

	require.False(t, advance(), "the slot has confirmed nothing since the mark")
	require.Zero(t, prune(), "an unadvanced slot keeps everything")

	pgtest.ConfirmSlot(t, db, slot)
	require.True(t, advance())
	require.Equal(t, int64(1), prune(), "what committed before the confirmed mark")
	require.Equal(t, []string{"m-1", "m-2"}, remaining())

	var confirmed string // past the mark the last advance took, before "late"
	require.NoError(t, db.QueryRow(`SELECT pg_current_wal_lsn()::text`).Scan(&confirmed))
	publishTx(t, db, w, "a", "late")
	pgtest.ConfirmSlotAt(t, db, slot, confirmed)
	require.True(t, advance())
	require.Equal(t, int64(2), prune())
	require.Equal(t, []string{"late"}, remaining(), "committed after the confirmed point")
	require.False(t, advance(), "the slot has not confirmed the newer mark")
	require.Zero(t, prune())

	forgot, err := outboxops.ForgetSlotPosition(ctx, db, schema, slot)
	require.NoError(t, err)
	require.True(t, forgot)
	require.Zero(t, prune(), "with no position left, nothing is known to be forwarded")
	require.Equal(t, []string{"late"}, remaining())
}

// A position whose slot is gone holds retention back: advancing it says so. A Relay cannot take
// a slot position's name.
func TestSlotPositionOfAMissingSlot(t *testing.T) {
	t.Parallel()
	db, schema, _ := setup(t)
	ctx := context.Background()
	slot := pgtest.NewName("noslot")
	_, err := outboxops.RegisterSlotPosition(ctx, db, schema, slot)
	require.NoError(t, err)
	_, err = outboxops.AdvanceSlotPosition(ctx, db, schema, slot)
	require.ErrorIs(t, err, outboxops.ErrSlotMissing)
	require.ErrorContains(t, err, "forget it")
	_, err = outboxops.RegisterSlotPosition(ctx, db, schema, "Bad-Slot")
	require.ErrorContains(t, err, "slot")

	_, err = outbox.NewRelay(db, &sink{}, outbox.RelayConfig{Schema: schema, Name: outboxops.SlotPositionName(slot)}, nil)
	require.ErrorContains(t, err, `starts with "cdc:"`)
}

// A Relay and a slot position side by side (a switch between them): a row goes only once both
// have passed it, and the Relay runs beside the slot's position without touching it.
func TestPruneWaitsForTheRelayAndTheSlot(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	slot := pgtest.LogicalSlot(t, db)
	_, err := outboxops.RegisterSlotPosition(ctx, db, schema, slot)
	require.NoError(t, err)
	publishTx(t, db, w, "a", "m-1", "m-2")
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "outbox")+` SET created_at = localtimestamp - interval '2 days'`)
	prune := func() int64 {
		t.Helper()
		n, err := outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 10})
		require.NoError(t, err)
		return n
	}
	advance := func() {
		t.Helper()
		pgtest.ConfirmSlot(t, db, slot)
		_, err := outboxops.AdvanceSlotPosition(ctx, db, schema, slot)
		require.NoError(t, err)
	}

	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	drain(t, r, s, 2)
	require.Zero(t, prune(), "the slot has confirmed nothing")
	advance()
	advance() // the first moved to the registration's mark, before the rows
	require.Equal(t, int64(2), prune())

	publishTx(t, db, w, "a", "m-3")
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "outbox")+` SET created_at = localtimestamp - interval '2 days'`)
	advance()
	advance()
	require.Zero(t, prune(), "the slot has confirmed it, the relay has not published it")
	drain(t, r, s, 3)
	require.Equal(t, int64(1), prune())
	relays, _, err := outbox.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.Len(t, relays, 2)
	require.Equal(t, outboxops.SlotPositionName(slot), relays[0].Name)
	require.Zero(t, relays[0].Backlog)
}
