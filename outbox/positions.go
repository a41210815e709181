package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/pgtx"
)

// Positions after a restore (outboxops.CheckPositions, RebasePositions): a position is made
// of transaction ids of the cluster it was recorded on, which a logical move does not keep.

// ErrPositionsMoved is returned, wrapped, by Prune and RelayOnce while positions of the schema
// were recorded on another cluster (a restore or a move): run `wmonce rebase` first.
var ErrPositionsMoved = outboxops.ErrPositionsMoved

// frozenXID is the transaction id RebasePositions gives rows every relay has forwarded whose
// own id would not be visible to the new positions: PostgreSQL's FrozenTransactionId, below
// every snapshot's xmin, so the row is forwarded in every position and Prune may delete it.
const frozenXID = "2"

// offsetHigh is an expression for the outbox "offset" sequence's current value: read after a
// snapshot was taken, it is at least the offset of every row visible in that snapshot (a row's
// offset is allocated before its transaction commits). pg_sequence_last_value needs USAGE or
// SELECT on the sequence, which every role that writes the outbox has.
func offsetHigh(schema string) string {
	return `coalesce(pg_sequence_last_value(pg_get_serial_sequence('` + pgtx.QualifiedName(schema, "outbox") + `', 'offset')::regclass), 0)`
}

// systemIdentifier returns pg_control_system().system_identifier, which a new cluster (initdb,
// a restore's target) changes and pg_upgrade and physical copies keep; "" when the role may
// not read it (then only the transaction-id checks can tell a move).
func systemIdentifier(ctx context.Context, q rowQuerier) (string, error) {
	// Asked first rather than caught: a refused call would abort the caller's transaction.
	var id sql.NullString
	err := q.QueryRowContext(ctx, `SELECT CASE WHEN has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE')
    THEN (SELECT system_identifier::text FROM pg_catalog.pg_control_system()) END`).Scan(&id)
	if err != nil {
		return "", fmt.Errorf("read system identifier: %w", err)
	}
	return id.String, nil
}

// checkAllPositions is outboxops.CheckPositions: whether each position is ahead of this
// cluster's transaction counter, hides rows written since, meets outbox rows from another
// cluster, or was recorded under another system identifier.
func checkAllPositions(ctx context.Context, db *sql.DB, schema string) (outboxops.PositionReport, error) {
	if err := checkSchema("check positions", db, &schema); err != nil {
		return outboxops.PositionReport{}, err
	}
	rep, err := checkPositions(ctx, db, schema, "")
	if err != nil {
		return outboxops.PositionReport{}, fmt.Errorf("outbox: check positions: %w", err)
	}
	return rep, nil
}

// checkPositions is checkAllPositions on q, for the position name alone unless name is "".
func checkPositions(ctx context.Context, q pgtx.Executor, schema, name string) (outboxops.PositionReport, error) {
	rep := outboxops.PositionReport{Schema: schema}
	var err error
	if rep.SystemIdentifier, err = systemIdentifier(ctx, q); err != nil {
		return rep, err
	}
	ob := pgtx.QualifiedName(schema, "outbox")
	var future int64
	// Every row a statement sees committed before its snapshot, so below its xmax: a row at or
	// above it was written on another cluster. The primary key makes this a range scan.
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM `+ob+` WHERE transaction_id >= pg_snapshot_xmax(pg_current_snapshot())`).Scan(&future); err != nil {
		return rep, err
	}
	type hidden struct {
		snapshot string
		xmax     uint64 // integers, scanned as such, so that they are safe to write into SQL
		high     int64
	}
	var bounds []hidden
	rep.Positions, err = pgtx.QueryAll(ctx, q, func(s pgtx.Scanner) (outboxops.PositionCheck, error) {
		c := outboxops.PositionCheck{FutureRows: future}
		var recorded sql.NullString
		var h hidden
		err := s.Scan(&c.Name, &c.Ahead, &c.SequenceBehind, &recorded, &h.snapshot, &h.xmax, &h.high)
		c.RecordedSystem = recorded.String
		c.SystemChanged = recorded.Valid && rep.SystemIdentifier != "" && recorded.String != rep.SystemIdentifier
		bounds = append(bounds, h)
		return c, err
	}, `SELECT o.consumer_group,
    greatest(pg_snapshot_xmax(o.snapshot), coalesce(pg_snapshot_xmax(o.target_snapshot), '1')) > pg_snapshot_xmax(pg_current_snapshot()),
    o.offset_high > `+offsetHigh(schema)+`,
    o.system_identifier::text, o.snapshot::text, pg_snapshot_xmax(o.snapshot)::text, o.offset_high::text
FROM `+pgtx.QualifiedName(schema, "outbox_offsets")+` o
WHERE $1 = '' OR o.consumer_group = $1
ORDER BY o.consumer_group`, name)
	if err != nil {
		return rep, err
	}
	// Hidden rows: offsets above offset_high were allocated after the position was recorded, so
	// on this cluster their transactions cannot be visible in its snapshot. A row visible in it
	// has an id below its xmax: the bounds, integers read from the database, are written into
	// the statement so that its plan walks the smaller of the two index ranges (the rows the
	// position has not passed, or those below its xmax).
	for i, b := range bounds {
		err := q.QueryRowContext(ctx, `SELECT count(*) FROM `+ob+` t WHERE t."offset" > `+strconv.FormatInt(b.high, 10)+
			` AND t.transaction_id < '`+strconv.FormatUint(b.xmax, 10)+`'::xid8
    AND pg_visible_in_snapshot(t.transaction_id, $1::pg_snapshot)`, b.snapshot).Scan(&rep.Positions[i].HiddenRows)
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// rebasePositions is outboxops.RebasePositions. Rows are provably forwarded by a relay when
// visible in its snapshot and written before it was recorded; every position is reset to this
// cluster's current snapshot, its round in progress dropped.
func rebasePositions(ctx context.Context, db *sql.DB, schema string) (outboxops.RebaseReport, error) {
	if err := checkSchema("rebase positions", db, &schema); err != nil {
		return outboxops.RebaseReport{}, err
	}
	var rep outboxops.RebaseReport
	err := pgtx.RunInTx(ctx, db, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		rep = outboxops.RebaseReport{Schema: schema}
		return rebasePositionsTx(ctx, tx, schema, &rep)
	})
	if err != nil {
		return outboxops.RebaseReport{}, fmt.Errorf("outbox: rebase positions: %w", err)
	}
	return rep, nil
}

// rebasePositionsTx is rebasePositions in its repeatable-read transaction.
func rebasePositionsTx(ctx context.Context, tx *sql.Tx, schema string, rep *outboxops.RebaseReport) error {
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	// The lock comes before the transaction's snapshot (taken by its first query), so the
	// snapshot sees every position update that committed before it; relays' updates wait.
	if _, err := tx.ExecContext(ctx, `LOCK TABLE `+offsets+` IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return err
	}
	check, err := checkPositions(ctx, tx, schema, "")
	if err != nil {
		return err
	}
	rep.SystemIdentifier = check.SystemIdentifier
	if len(check.Moved()) == 0 {
		return rerecordSystem(ctx, tx, offsets, check, rep)
	}
	for _, c := range check.Positions {
		rep.Positions = append(rep.Positions, c.Name)
	}
	suspect, base, err := moveOffsetSequenceOn(ctx, tx, schema)
	if err != nil {
		return err
	}
	// The new positions: the transaction's snapshot, read before it has a transaction id
	// (its first write), so its own rows are not visible in it and the relays read them.
	var snap, high string
	if err := tx.QueryRowContext(ctx, `SELECT pg_current_snapshot()::text, `+offsetHigh(schema)+`::text`).Scan(&snap, &high); err != nil {
		return err
	}
	if err := rewriteOutboxRows(ctx, tx, schema, snap, suspect, base, rep); err != nil {
		return err
	}
	if suspect.Valid {
		ob := pgtx.QualifiedName(schema, "outbox")
		if _, err := tx.ExecContext(ctx, `SELECT setval(pg_get_serial_sequence('`+ob+`', 'offset'), $1::bigint)`, base.Int64+rep.Republished); err != nil {
			return fmt.Errorf("move the offset sequence on: %w", err)
		}
	}
	// Slot positions lose their pending mark too (offset_acked NULL): the next
	// advanceSlotPosition takes a new one on this cluster. An unknown system identifier ("")
	// is recorded as NULL.
	_, err = tx.ExecContext(ctx, `UPDATE `+offsets+` SET snapshot = $1::pg_snapshot, target_snapshot = NULL, target_offset = NULL,
    last_processed_transaction_id = pg_snapshot_xmin($1::pg_snapshot), offset_acked = CASE WHEN consumer_group LIKE '`+outboxops.SlotPositionPrefix+`%' THEN NULL ELSE 0 END,
    offset_high = $2::bigint, system_identifier = nullif($3, '')::bigint`, snap, high, check.SystemIdentifier)
	if err != nil {
		return fmt.Errorf("reset positions: %w", err)
	}
	return nil
}

// rerecordSystem, when no position moved, records a changed system identifier and nothing else.
func rerecordSystem(ctx context.Context, tx *sql.Tx, offsets string, check outboxops.PositionReport, rep *outboxops.RebaseReport) error {
	for _, c := range check.Positions {
		rep.Rerecorded = rep.Rerecorded || c.SystemChanged
	}
	if !rep.Rerecorded {
		return nil
	}
	_, err := tx.ExecContext(ctx, `UPDATE `+offsets+` SET system_identifier = $1::bigint`, check.SystemIdentifier)
	return err
}

// moveOffsetSequenceOn handles a sequence behind the positions (not carried over by the move):
// it has given rows written since offsets the positions count as forwarded, so every row at or
// below its value now may be such a row and is republished (suspect: that value, valid when
// behind). Then it is set above every offset and position (base: that value), so that rows
// written from now on are above the new positions' offset_high.
func moveOffsetSequenceOn(ctx context.Context, tx *sql.Tx, schema string) (suspect, base sql.NullInt64, err error) {
	ob := pgtx.QualifiedName(schema, "outbox")
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	var seqNow int64
	var behind bool
	if err := tx.QueryRowContext(ctx, `SELECT `+offsetHigh(schema)+`,
    `+offsetHigh(schema)+` < greatest((SELECT max(offset_high) FROM `+offsets+`), (SELECT max("offset") FROM `+ob+`))`).Scan(&seqNow, &behind); err != nil {
		return suspect, base, err
	}
	// Rows written since share offsets with restored ones: the rows republished get new
	// offsets above every one (base + their rank in offset order), so that they stay
	// unique and in insertion order.
	suspect = sql.NullInt64{Int64: seqNow, Valid: behind}
	if behind {
		if err := tx.QueryRowContext(ctx, `SELECT setval(pg_get_serial_sequence('`+ob+`', 'offset'),
    greatest((SELECT max(offset_high) FROM `+offsets+`), (SELECT max("offset") FROM `+ob+`)))`).Scan(&base); err != nil {
			return suspect, base, fmt.Errorf("move the offset sequence on: %w", err)
		}
	}
	return suspect, base, nil
}

// rewriteOutboxRows gives the rows not forwarded by all their relays this transaction's id
// (under new offsets above base when suspect is valid) and a frozen id to the forwarded ones
// the new positions would not see as forwarded.
func rewriteOutboxRows(ctx context.Context, tx *sql.Tx, schema, snap string, suspect, base sql.NullInt64, rep *outboxops.RebaseReport) error {
	ob := pgtx.QualifiedName(schema, "outbox")
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	// A relay (or slot position) forwarded a row when the row is visible in its snapshot
	// and was written before the snapshot was recorded (offset <= offset_high), or is part
	// of its round in progress; only the positions of the row's source count. All in one
	// statement, so every condition reads the rows' old ids.
	serving := `(o.source IS NULL OR o.source = t.source)`
	forwarded := `(((pg_visible_in_snapshot(t.transaction_id, o.snapshot) AND t."offset" <= o.offset_high)
            OR coalesce(pg_visible_in_snapshot(t.transaction_id, o.target_snapshot) AND t."offset" <= o.target_offset, false))
        AND ($2::bigint IS NULL OR t."offset" > $2::bigint))`
	err := tx.QueryRowContext(ctx, `WITH rows AS (
    SELECT t.transaction_id, t."offset",
        EXISTS (SELECT 1 FROM `+offsets+` o WHERE `+serving+`) AS served,
        NOT EXISTS (SELECT 1 FROM `+offsets+` o WHERE `+serving+` AND NOT `+forwarded+`) AS all_forwarded
    FROM `+ob+` t
), changed AS (
    SELECT transaction_id, "offset", served AND all_forwarded AS frozen FROM rows
    WHERE (served AND all_forwarded AND transaction_id >= pg_snapshot_xmin($1::pg_snapshot))
       OR (served AND NOT all_forwarded)
       OR (NOT served AND transaction_id >= pg_snapshot_xmax($1::pg_snapshot))
), numbered AS (
    SELECT c.*, row_number() OVER (PARTITION BY frozen ORDER BY "offset", transaction_id) AS rank FROM changed c
), updated AS (
    UPDATE `+ob+` t SET transaction_id = CASE WHEN c.frozen THEN '`+frozenXID+`'::xid8 ELSE pg_current_xact_id() END,
        "offset" = CASE WHEN c.frozen OR $3::bigint IS NULL THEN t."offset" ELSE $3::bigint + c.rank END
    FROM numbered c WHERE t.transaction_id = c.transaction_id AND t."offset" = c."offset"
    RETURNING c.frozen
)
SELECT count(*) FILTER (WHERE NOT frozen), count(*) FILTER (WHERE frozen) FROM updated`, snap, suspect, base).Scan(&rep.Republished, &rep.Frozen)
	if err != nil {
		return fmt.Errorf("rewrite outbox rows: %w", err)
	}
	return nil
}
