package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/owner"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// The operations below are what retention, admin, metrics and the CLI do to the outbox tables.
// outbox owns outbox, outbox_offsets and outbox_rejected: no other package holds SQL on them.

// relayLockKey is the advisory-lock key a relay named name holds in schema while it leads.
// ForgetRelay looks for the same key in pg_locks, so both derive it here.
func relayLockKey(schema, name string) int64 { return worker.LockKey("relay", schema, name) }

func checkSchema(op string, db *sql.DB, schema *string) error {
	if db == nil {
		return fmt.Errorf("outbox: %s: db is nil", op)
	}
	if *schema == "" {
		*schema = pgtx.DefaultSchema
	}
	if err := pgtx.ValidateIdentifier("schema", *schema); err != nil {
		return fmt.Errorf("outbox: %s: %w", op, err)
	}
	return nil
}

// ErrRelayActive is returned by ForgetRelay for a relay that leads right now.
var ErrRelayActive = errors.New("outbox: the relay is running: stop every instance of it first")

// ForgetRelay deletes a retired relay's position, held rows and delayed rows (not its rejected
// rows), and reports whether the position existed: a name that no longer runs holds outbox
// retention back for good. It refuses (ErrRelayActive) while an instance leads; stop standbys
// too, or one starts again at the oldest row and republishes it.
func ForgetRelay(ctx context.Context, db *sql.DB, schema, name string) (bool, error) {
	if err := checkRelayName("forget relay", db, &schema, name); err != nil {
		return false, err
	}
	active, err := relayActive(ctx, db, schema, name)
	if err != nil {
		return false, fmt.Errorf("outbox: forget relay: %w", err)
	}
	if active {
		return false, fmt.Errorf("%w (relay %q)", ErrRelayActive, name)
	}
	// One statement: the held and delayed rows go with the position, atomically.
	res, err := db.ExecContext(ctx, `WITH held AS (DELETE FROM `+pgtx.QualifiedName(schema, "outbox_held")+` WHERE relay = $1),
    delayed AS (DELETE FROM `+pgtx.QualifiedName(schema, "outbox_delayed")+` WHERE relay = $1)
DELETE FROM `+pgtx.QualifiedName(schema, "outbox_offsets")+` WHERE consumer_group = $1`, name)
	if err != nil {
		return false, fmt.Errorf("outbox: forget relay: %w", err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

func checkRelayName(op string, db *sql.DB, schema *string, name string) error {
	if err := checkSchema(op, db, schema); err != nil {
		return err
	}
	if name == "" {
		return fmt.Errorf("outbox: %s: name the relay (its RelayConfig.Name)", op)
	}
	return nil
}

// relayActive reports whether an instance of the relay named name leads in schema right now
// (holds its leadership lock, on any connection to this database). Standby instances do not
// count.
func relayActive(ctx context.Context, db *sql.DB, schema, name string) (bool, error) {
	if err := checkRelayName("relay active", db, &schema, name); err != nil {
		return false, err
	}
	// An advisory lock on a bigint key shows in pg_locks as classid (high 32 bits), objid
	// (low 32 bits), objsubid 1.
	classid, objid := worker.LockKeyParts(relayLockKey(schema, name))
	var active bool
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1)`, classid, objid).Scan(&active); err != nil {
		return false, fmt.Errorf("outbox: relay active: %w", err)
	}
	return active, nil
}

// Prune deletes outbox rows written before req's cutoff (by the database clock) in batches of
// req.BatchSize, and returns how many it deleted, also when it stops on an error.
//
// Guarantee: a row is deleted only once every relay of its source is registered and has passed
// it (a slot position counts as one of every source): a row no relay of its source has published
// is never deleted, whatever its age or transaction id. A retired relay name holds every later
// row back until ForgetRelay. Where it stops: it refuses with ErrPositionsMoved after a restore
// until `wmonce rebase`.
func Prune(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	schema, req, cutoff, err := owner.CheckPrune(ctx, db, schema, req, owner.Unscoped)
	if err != nil {
		return 0, fmt.Errorf("outbox: prune: %w", err)
	}
	// A position recorded on another cluster makes rows written since look forwarded: refuse
	// until it is rebased, whatever the rule below says.
	check, err := checkPositions(ctx, db, schema, "")
	if err != nil {
		return 0, fmt.Errorf("outbox: prune: check positions: %w", err)
	}
	if err := check.Err(); err != nil {
		return 0, fmt.Errorf("outbox: prune refused: %w", err)
	}
	ob := pgtx.QualifiedName(schema, "outbox")
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	// A relay's position is a snapshot (relay.go): it has published every row whose
	// transaction is visible in snapshot, and, in a round in progress, the rows visible in
	// target_snapshot up to target_offset. Every such row lies below the xmax of the round's
	// snapshot, so the least of those over all relays bounds the rows any relay could have
	// published; no row means no relay has ever run.
	var bound string
	err = db.QueryRowContext(ctx, `SELECT pg_snapshot_xmax(coalesce(target_snapshot, snapshot))::text FROM `+offsets+`
ORDER BY pg_snapshot_xmax(coalesce(target_snapshot, snapshot)) LIMIT 1`).Scan(&bound)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: prune: read relay positions: %w", err)
	}
	// The batch is the oldest rows in transaction order that every relay has published, and
	// only those of them old enough go: the loop stops when a batch holds a younger row, so a
	// call never walks the rows kept. created_at is a timestamp without time zone written
	// with the session's clock, hence the cutoff in the session's time zone. The relays are read again here,
	// so one registered since the bound was read holds rows back too. ctid = ANY(ARRAY(...))
	// deletes the batch by physical address (a TID scan). A relay passes over the rows of
	// other sources without publishing them: only the relays of a row's source count for it.
	// A row counts as passed only if it is visible in the snapshot AND was written before the
	// snapshot was recorded (offset_high, migration 019): a row written after a restore has a
	// higher offset whatever its transaction id, so no position can make it look forwarded.
	query := `DELETE FROM ` + ob + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM (
        SELECT t.ctid, t.created_at FROM ` + ob + ` t
        WHERE t.transaction_id < $1::xid8
          AND EXISTS (SELECT 1 FROM ` + offsets + ` o WHERE o.source IS NULL OR o.source = t.source)
          AND NOT EXISTS (SELECT 1 FROM ` + offsets + ` o WHERE (o.source IS NULL OR o.source = t.source) AND NOT (
                (pg_visible_in_snapshot(t.transaction_id, o.snapshot) AND t."offset" <= o.offset_high)
                OR coalesce(pg_visible_in_snapshot(t.transaction_id, o.target_snapshot) AND t."offset" <= o.target_offset, false)))
        ORDER BY t.transaction_id, t."offset"
        LIMIT $3) head
    WHERE created_at < ($2::timestamptz AT TIME ZONE current_setting('TimeZone'))))`
	n, err := pgtx.DeleteInBatches(ctx, db, req.BatchSize, query, bound, cutoff)
	if err != nil {
		return n, fmt.Errorf("outbox: prune: %w", err)
	}
	return n, nil
}

// listRejected lists the rows of outbox_rejected matching f in offset order, for up to limit
// outbox rows (two relays rejecting the same row give two rows of one offset; a page never
// splits them). withPayload includes payloads and metadata. A schema without the table is an
// error for which pgtx.IsUndefinedTable is true. It only reads.
func listRejected(ctx context.Context, db *sql.DB, schema string, f outboxops.RejectedFilter, limit int, withPayload bool) ([]outboxops.RejectedRow, error) {
	if err := checkSchema("list rejected", db, &schema); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, fmt.Errorf("outbox: list rejected: limit must be positive, got %d", limit)
	}
	table := pgtx.QualifiedName(schema, "outbox_rejected")
	// A zero field of f matches everything: "" and 0 by comparison, times as NULL.
	where := `($1 = '' OR relay = $1) AND ($2::bigint = 0 OR "offset" = $2) AND ($3::timestamptz IS NULL OR rejected_at >= $3)
    AND ($4::timestamptz IS NULL OR rejected_at < $4) AND "offset" > $5`
	cols := `relay, "offset", transaction_id::text, uuid, coalesce(topic, ''), source, coalesce(octet_length(payload::text), 0), error, rejected_at`
	if withPayload {
		cols += `, payload::text, metadata::text`
	}
	q := `SELECT ` + cols + ` FROM ` + table + ` WHERE ` + where + ` AND "offset" IN (SELECT DISTINCT "offset" FROM ` + table +
		` WHERE ` + where + ` ORDER BY 1 LIMIT $6) ORDER BY "offset", relay`
	args := []any{f.Relay, f.Offset, nullTime(f.RejectedAfter), nullTime(f.RejectedBefore), f.AfterOffset, limit}
	out, err := pgtx.QueryAll(ctx, db, rejectedRowScanner(withPayload), q, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: list rejected: %w", err)
	}
	return out, nil
}

// rejectedRowScanner returns the scan function of ListRejected's rows: with withPayload they
// end with the payload and the metadata.
// nullTime is t, or NULL for the zero time.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

func rejectedRowScanner(withPayload bool) func(pgtx.Scanner) (outboxops.RejectedRow, error) {
	return func(s pgtx.Scanner) (outboxops.RejectedRow, error) {
		var r outboxops.RejectedRow
		dest := []any{&r.Relay, &r.Offset, &r.TransactionID, &r.UUID, &r.Topic, &r.Source, &r.PayloadSize, &r.LastError, &r.RejectedAt}
		var payload, metadata sql.NullString
		if withPayload {
			dest = append(dest, &payload, &metadata)
		}
		if err := s.Scan(dest...); err != nil {
			return outboxops.RejectedRow{}, err
		}
		if payload.Valid {
			r.Payload = &payload.String
		}
		if metadata.Valid && json.Valid([]byte(metadata.String)) {
			r.Metadata = json.RawMessage(metadata.String)
		}
		return r, nil
	}
}

// PruneRejected deletes the rows set aside in outbox_rejected before req's cutoff, in batches,
// and returns how many it deleted. A rejected row is the only copy of its message: keep it long
// enough for operators to republish (the janitor's retention.Config.RejectedKeep).
func PruneRejected(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error) {
	n, err := owner.PruneOlder(ctx, db, schema, req, "outbox_rejected", "rejected_at", false, "")
	if err != nil {
		return n, fmt.Errorf("outbox: prune rejected: %w", err)
	}
	return n, nil
}
