package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// RelayStatus is how far one relay (a row of outbox_offsets) has come.
type RelayStatus struct {
	Name string
	// Backlog counts committed rows the relay has not published yet: rows of transactions that
	// are not visible in its position's snapshot, less the part of a round in progress that it
	// published.
	Backlog int64
	// OldestPending is when the oldest waiting row was written (zero when Backlog is 0); now
	// minus it is the relay lag.
	OldestPending time.Time
	// Lag is now minus OldestPending, measured by the database clock (zero when caught up).
	Lag time.Duration
}

// Status reports every relay's backlog and lag in schema, and the number of rows set aside in
// outbox_rejected. A relay that has never run has no row and is not listed. It reads with
// plain SELECTs and changes nothing.
func Status(ctx context.Context, db *sql.DB, schema string) (relays []RelayStatus, rejected int64, err error) {
	if db == nil {
		return nil, 0, errors.New("outbox: status: db is nil")
	}
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return nil, 0, fmt.Errorf("outbox: %w", err)
	}
	table := pgtx.QualifiedName(schema, "outbox")
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	rows, err := db.QueryContext(ctx, `
SELECT o.consumer_group, b.backlog, b.oldest, coalesce(extract(epoch FROM now() - b.oldest), 0)
FROM `+offsets+` o
CROSS JOIN LATERAL (
    SELECT count(*) AS backlog, min(t.created_at)::timestamptz AS oldest
    FROM `+table+` t
    WHERE t.transaction_id >= pg_snapshot_xmin(o.snapshot)
      AND NOT pg_visible_in_snapshot(t.transaction_id, o.snapshot)
      AND NOT coalesce(pg_visible_in_snapshot(t.transaction_id, o.target_snapshot) AND t."offset" <= o.target_offset, false)
) b
ORDER BY o.consumer_group`)
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: status: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s RelayStatus
		var oldest sql.NullTime
		var lagSeconds float64
		if err := rows.Scan(&s.Name, &s.Backlog, &oldest, &lagSeconds); err != nil {
			return nil, 0, fmt.Errorf("outbox: status: %w", err)
		}
		s.OldestPending = oldest.Time
		s.Lag = time.Duration(lagSeconds * float64(time.Second))
		relays = append(relays, s)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("outbox: status: %w", err)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox_rejected")).Scan(&rejected); err != nil {
		return nil, 0, fmt.Errorf("outbox: status: %w", err)
	}
	return relays, rejected, nil
}
