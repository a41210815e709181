package admin

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/outbox"
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

// ListRejected lists the rows of outbox_rejected through outbox.ListRejected, as JSON rows.
func ListRejected(ctx context.Context, db *sql.DB, schema string, f outbox.RejectedFilter, limit int, withPayload bool) ([]RejectedRow, error) {
	rows, err := outbox.ListRejected(ctx, db, schema, f, limit, withPayload)
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

// GET /api/outbox/rejected[?relay=R][&rejected_after=T][&rejected_before=T][&after=OFFSET][&limit=N]
func (h *Handler) rejectedList(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	f := outbox.RejectedFilter{Relay: q.Get("relay")}
	if err := CheckText("relay", f.Relay); err != nil {
		return nil, badRequest("%v", err)
	}
	var err error
	if f.RejectedAfter, err = parseTime(q, "rejected_after"); err != nil {
		return nil, err
	}
	if f.RejectedBefore, err = parseTime(q, "rejected_before"); err != nil {
		return nil, err
	}
	if f.AfterOffset, err = parseID(q, "after", "an outbox offset"); err != nil {
		return nil, err
	}
	limit, err := parseLimit(q)
	if err != nil {
		return nil, err
	}
	rows, err := ListRejected(ctx, h.db, h.config.Schema, f, limit, false)
	if err != nil {
		return nil, err
	}
	out := RejectedListResponse{Rows: rows}
	if n := distinctOffsets(rows); n == limit {
		out.NextAfter = rows[len(rows)-1].Offset
	}
	return out, nil
}

func distinctOffsets(rows []RejectedRow) int {
	n := 0
	for i, r := range rows {
		if i == 0 || r.Offset != rows[i-1].Offset {
			n++
		}
	}
	return n
}

// GET /api/outbox/rejected/{offset}[?relay=R]
func (h *Handler) rejectedInspect(ctx context.Context, r *http.Request) (any, error) {
	offset, err := strconv.ParseInt(r.PathValue("offset"), 10, 64)
	if err != nil || offset < 1 {
		return nil, badRequest("the outbox offset must be a positive integer, got %q", r.PathValue("offset"))
	}
	relay := r.URL.Query().Get("relay")
	if err := CheckText("relay", relay); err != nil {
		return nil, badRequest("%v", err)
	}
	rows, err := ListRejected(ctx, h.db, h.config.Schema, outbox.RejectedFilter{Relay: relay, Offset: offset}, 1, true)
	if err != nil {
		return nil, err
	}
	switch len(rows) {
	case 0:
		if relay != "" {
			return nil, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("no rejected outbox row at offset %d for relay %q", offset, relay)}
		}
		return nil, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("no rejected outbox row at offset %d", offset)}
	case 1:
		return rows[0], nil
	}
	names := make([]string, len(rows))
	for i, row := range rows {
		names[i] = strconv.Quote(row.Relay)
	}
	return nil, badRequest("outbox row %d was rejected by relays %s: give relay", offset, strings.Join(names, ", "))
}

// parseTime reads an optional RFC 3339 time parameter.
func parseTime(q map[string][]string, param string) (time.Time, error) {
	v := ""
	if vs := q[param]; len(vs) > 0 {
		v = vs[0]
	}
	if v == "" {
		return time.Time{}, nil
	}
	if err := CheckText(param, v); err != nil {
		return time.Time{}, badRequest("%v", err)
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, badRequest("%s must be an RFC 3339 time such as 2026-01-02T15:04:05Z, got %q", param, v)
	}
	return t, nil
}

// parseID reads an optional non-negative integer parameter (0 when absent).
func parseID(q map[string][]string, param, what string) (int64, error) {
	v := ""
	if vs := q[param]; len(vs) > 0 {
		v = vs[0]
	}
	if v == "" {
		return 0, nil
	}
	if err := CheckText(param, v); err != nil {
		return 0, badRequest("%v", err)
	}
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 0 {
		return 0, badRequest("%s must be %s (a non-negative integer), got %q", param, what, v)
	}
	return id, nil
}

// parseLimit reads the limit parameter: 1 to MaxListLimit, default 100.
func parseLimit(q map[string][]string) (int, error) {
	v := ""
	if vs := q["limit"]; len(vs) > 0 {
		v = vs[0]
	}
	if v == "" {
		return 100, nil
	}
	if err := CheckText("limit", v); err != nil {
		return 0, badRequest("%v", err)
	}
	limit, err := strconv.Atoi(v)
	if err != nil || limit < 1 || limit > MaxListLimit {
		return 0, badRequest("limit must be an integer between 1 and %d, got %q", MaxListLimit, v)
	}
	return limit, nil
}
