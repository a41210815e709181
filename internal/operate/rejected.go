package operate

import (
	"context"
	"database/sql"
	"encoding/json"
	"time"

	"github.com/wmonce/watermill-once/internal/outboxops"
)

// RejectedRow is a row of outbox_rejected: an outbox row a relay set aside instead of
// forwarding, because it could not decode it (written by something other than watermill-once;
// Topic is then empty) or because the broker refused it for good (Topic is its destination).
// The relay rejects a row at the first such failure, so there is no attempt count; LastError
// is the decoding error or the broker's. Lists leave the payload and metadata out
// (PayloadSize tells the payload's length); GET /api/outbox/rejected/{offset} includes them.
// Both are the JSON the row held (the outbox columns are of type json), as text.
// POST /api/outbox/republish stores rows again (RepublishRequest).
type RejectedRow struct {
	Relay         string          `json:"relay"`
	Offset        int64           `json:"offset"`
	TransactionID string          `json:"transaction_id"`
	UUID          string          `json:"uuid"`
	Topic         string          `json:"topic"`
	Source        string          `json:"source"`
	PayloadSize   int             `json:"payload_size"`
	Payload       *string         `json:"payload,omitempty"`
	Metadata      json.RawMessage `json:"metadata,omitempty"`
	LastError     string          `json:"last_error"`
	RejectedAt    time.Time       `json:"rejected_at"`
}

// RejectedListResponse is GET /api/outbox/rejected: rows in offset order. NextAfter, when not
// zero, is the "after" parameter of the next page.
type RejectedListResponse struct {
	Rows      []RejectedRow `json:"rows"`
	NextAfter int64         `json:"next_after,omitempty"`
}

// ListRejected lists the rows of outbox_rejected through outboxops.ListRejected, as JSON rows.
func ListRejected(ctx context.Context, db *sql.DB, schema string, f outboxops.RejectedFilter, limit int, withPayload bool) ([]RejectedRow, error) {
	rows, err := outboxops.ListRejected(ctx, db, schema, f, limit, withPayload)
	if err != nil {
		return nil, err
	}
	out := make([]RejectedRow, len(rows))
	for i, r := range rows {
		out[i] = RejectedRow{
			Relay: r.Relay, Offset: r.Offset, TransactionID: r.TransactionID, UUID: r.UUID, Topic: r.Topic, Source: r.Source,
			PayloadSize: r.PayloadSize, Payload: r.Payload, Metadata: r.Metadata,
			LastError: r.LastError, RejectedAt: r.RejectedAt,
		}
	}
	return out, nil
}
