package admin

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/outboxops"
)

// GET /api/outbox/rejected[?relay=R][&rejected_after=T][&rejected_before=T][&after=OFFSET][&limit=N]
func (h *Handler) rejectedList(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	f := outboxops.RejectedFilter{Relay: q.Get("relay")}
	if err := operate.CheckText("relay", f.Relay); err != nil {
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
	rows, err := operate.ListRejected(ctx, h.db, h.config.Schema, f, limit, false)
	if err != nil {
		return nil, err
	}
	out := operate.RejectedListResponse{Rows: rows}
	if n := distinctOffsets(rows); n == limit {
		out.NextAfter = rows[len(rows)-1].Offset
	}
	return out, nil
}

func distinctOffsets(rows []operate.RejectedRow) int {
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
	if err := operate.CheckText("relay", relay); err != nil {
		return nil, badRequest("%v", err)
	}
	rows, err := operate.ListRejected(ctx, h.db, h.config.Schema, outboxops.RejectedFilter{Relay: relay, Offset: offset}, 1, true)
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
	if err := operate.CheckText(param, v); err != nil {
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
	if err := operate.CheckText(param, v); err != nil {
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
	if err := operate.CheckText("limit", v); err != nil {
		return 0, badRequest("%v", err)
	}
	limit, err := strconv.Atoi(v)
	if err != nil || limit < 1 || limit > operate.MaxListLimit {
		return 0, badRequest("limit must be an integer between 1 and %d, got %q", operate.MaxListLimit, v)
	}
	return limit, nil
}
