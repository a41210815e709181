package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/pgtx"
)

// A slot position is a row of outbox_offsets that follows a logical replication slot instead of
// a Relay: the outbox read by Debezium (package outbox/cdc) has no Relay position, and Prune
// keeps every row no registered position has passed. It uses the columns a Relay's position
// has, so Prune and Stats read it as they read a Relay's:
//
//	snapshot         every transaction visible in it has been confirmed by the slot's reader.
//	target_snapshot  the pending mark: pg_current_snapshot() taken before offset_acked.
//	target_offset    0: no row of the mark counts as confirmed while it is pending.
//	offset_acked     the pending mark's LSN (pg_current_wal_insert_lsn(), as a number).
//	source           NULL: the slot's reader forwards the rows of every source.
//	offset_high      the outbox "offset" sequence's value when the mark became the position
//	                 (read after the mark's snapshot was taken: migration 019).
//
// Every transaction visible in the mark's snapshot inserted its commit record before the mark's
// LSN was read (a transaction becomes visible only after its commit record is in the WAL), and
// a logical slot never again sends a transaction whose commit record starts before its
// confirmed_flush_lsn. So once confirmed_flush_lsn reaches the mark's LSN, the reader has
// confirmed every transaction of the mark's snapshot, and the mark becomes the position.

func checkSlot(op string, db *sql.DB, schema *string, slot string) error {
	if err := checkSchema(op, db, schema); err != nil {
		return err
	}
	if err := pgtx.ValidateIdentifier("slot", slot); err != nil {
		return fmt.Errorf("outbox: %s: %w", op, err)
	}
	return nil
}

// markColumns takes a new mark: the statement's snapshot is taken before the LSN is read.
const markColumns = `target_snapshot = pg_current_snapshot(), target_offset = 0,
    offset_acked = pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`

// registerSlotPosition registers the position of the logical replication slot slot in schema,
// if it is not registered yet, and reports whether it registered it. The position starts
// having confirmed nothing, so from now on Prune keeps every row until advanceSlotPosition
// has seen the slot confirm it. The slot need not exist yet (the connector creates it). It is
// idempotent.
func registerSlotPosition(ctx context.Context, db *sql.DB, schema, slot string) (bool, error) {
	if err := checkSlot("register slot position", db, &schema, slot); err != nil {
		return false, err
	}
	res, err := db.ExecContext(ctx, `INSERT INTO `+pgtx.QualifiedName(schema, "outbox_offsets")+`
    (consumer_group, last_processed_transaction_id, snapshot, target_snapshot, target_offset, offset_acked, source)
VALUES ($1, '1', '1:1:', pg_current_snapshot(), 0, pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, NULL)
ON CONFLICT (consumer_group) DO NOTHING`, outboxops.SlotPositionName(slot))
	if err != nil {
		return false, fmt.Errorf("outbox: register slot position %s: %w", slot, err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// advanceSlotPosition is outboxops.AdvanceSlotPosition. Each call checks the pending mark: when
// the slot's confirmed_flush_lsn has reached the mark's LSN, the mark becomes the position and
// a new mark is taken; otherwise nothing changes. The position therefore trails the slot by up
// to two calls.
func advanceSlotPosition(ctx context.Context, db *sql.DB, schema, slot string) (bool, error) {
	if err := checkSlot("advance slot position", db, &schema, slot); err != nil {
		return false, err
	}
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	name := outboxops.SlotPositionName(slot)
	var advanced bool
	err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		// One statement: the position (locked), whether the slot exists, and what it confirmed.
		// confirmed_flush_lsn is NULL on a physical slot and on a logical slot that is not yet
		// consistent: nothing is confirmed then.
		var pending sql.NullBool
		var exists bool
		var confirmed sql.NullString
		err := tx.QueryRowContext(ctx, `SELECT (SELECT target_snapshot IS NOT NULL AND offset_acked IS NOT NULL FROM `+offsets+`
        WHERE consumer_group = $1 FOR UPDATE),
    EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2),
    (SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::bigint::text FROM pg_replication_slots WHERE slot_name = $2)`,
			name, slot).Scan(&pending, &exists, &confirmed)
		switch {
		case err != nil:
			return err
		case !pending.Valid:
			return fmt.Errorf("%w (slot %s, schema %s): register it first (cdc.Prepare, wmonce connector apply)", outboxops.ErrSlotPositionNotRegistered, slot, schema)
		case !exists:
			return fmt.Errorf("%w (slot %s): its position %s in schema %s holds outbox retention back: forget it (cdc.Remove, wmonce connector delete, wmonce outbox forget -relay cdc:<slot>)", outboxops.ErrSlotMissing, slot, name, schema)
		}
		if !pending.Bool {
			_, err := tx.ExecContext(ctx, `UPDATE `+offsets+` SET `+markColumns+` WHERE consumer_group = $1`, name)
			return err
		}
		if !confirmed.Valid {
			return nil
		}
		res, err := tx.ExecContext(ctx, `UPDATE `+offsets+` SET snapshot = target_snapshot, offset_high = `+offsetHigh(schema)+`,
    last_processed_transaction_id = pg_snapshot_xmin(target_snapshot), `+markColumns+`
WHERE consumer_group = $1 AND offset_acked <= $2::bigint`, name, confirmed.String)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		advanced = n > 0
		return nil
	})
	if err != nil {
		if errors.Is(err, outboxops.ErrSlotPositionNotRegistered) || errors.Is(err, outboxops.ErrSlotMissing) {
			return false, err
		}
		return false, fmt.Errorf("outbox: advance slot position %s: %w", slot, err)
	}
	return advanced, nil
}

// forgetSlotPosition is outboxops.ForgetSlotPosition.
func forgetSlotPosition(ctx context.Context, db *sql.DB, schema, slot string) (bool, error) {
	if err := checkSlot("forget slot position", db, &schema, slot); err != nil {
		return false, err
	}
	res, err := db.ExecContext(ctx, `DELETE FROM `+pgtx.QualifiedName(schema, "outbox_offsets")+` WHERE consumer_group = $1`, outboxops.SlotPositionName(slot))
	if err != nil {
		return false, fmt.Errorf("outbox: forget slot position %s: %w", slot, err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// slotPositions lists the slots whose positions are registered in schema, by name. The
// retention janitor advances each of them every round.
func slotPositions(ctx context.Context, db *sql.DB, schema string) ([]string, error) {
	if err := checkSchema("list slot positions", db, &schema); err != nil {
		return nil, err
	}
	slots, err := pgtx.QueryAll(ctx, db, func(s pgtx.Scanner) (string, error) {
		var slot string
		err := s.Scan(&slot)
		return slot, err
	}, `SELECT substr(consumer_group, length($1) + 1) FROM `+pgtx.QualifiedName(schema, "outbox_offsets")+
		` WHERE starts_with(consumer_group, $1) ORDER BY consumer_group`, outboxops.SlotPositionPrefix)
	if err != nil {
		return nil, fmt.Errorf("outbox: list slot positions: %w", err)
	}
	return slots, nil
}

func checkRelayNotSlotPosition(name string) error {
	if strings.HasPrefix(name, outboxops.SlotPositionPrefix) {
		return fmt.Errorf("relay Name %q starts with %q, which names the positions of replication slots (outboxops.SlotPositionName)", name, outboxops.SlotPositionPrefix)
	}
	return nil
}
