package admin

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
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
	var errAfter, errBefore, errOffset, errLimit error
	f.RejectedAfter, errAfter = parseTime(q, "rejected_after")
	f.RejectedBefore, errBefore = parseTime(q, "rejected_before")
	f.AfterOffset, errOffset = queryInt(q, "after", 0, 0, math.MaxInt64, "an outbox offset (a non-negative integer)")
	limit, errLimit := queryInt(q, "limit", 100, 1, operate.MaxListLimit, fmt.Sprintf("an integer between 1 and %d", operate.MaxListLimit))
	if err := operate.FirstError(errAfter, errBefore, errOffset, errLimit); err != nil {
		return nil, err
	}
	rows, err := operate.ListRejected(ctx, h.db, h.config.Schema, f, int(limit), false)
	if err != nil {
		return nil, err
	}
	out := operate.RejectedListResponse{Rows: rows}
	if n := distinctOffsets(rows); n == int(limit) {
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
	rows, err := operate.ListRejected(ctx, h.db, h.config.Schema, outboxops.RejectedFilter{Relay: relay, Offset: offset}, 1, true)
	if err != nil {
		return nil, err
	}
	return oneRejected(rows, offset, relay)
}

// oneRejected is the row at offset, 404 when no relay rejected it, and 400 when several did
// and relay does not say which.
func oneRejected(rows []operate.RejectedRow, offset int64, relay string) (any, error) {
	if len(rows) == 1 {
		return rows[0], nil
	}
	if len(rows) == 0 {
		return nil, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("no rejected outbox row at offset %d%s", offset, forRelay(relay))}
	}
	names := make([]string, len(rows))
	for i, row := range rows {
		names[i] = strconv.Quote(row.Relay)
	}
	return nil, badRequest("outbox row %d was rejected by relays %s: give relay", offset, strings.Join(names, ", "))
}

func forRelay(relay string) string {
	if relay == "" {
		return ""
	}
	return fmt.Sprintf(" for relay %q", relay)
}

// parseTime reads an optional RFC 3339 time parameter. (serve has checked it is text.)
func parseTime(q url.Values, param string) (time.Time, error) {
	v := q.Get(param)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, badRequest("%s must be an RFC 3339 time such as 2026-01-02T15:04:05Z, got %q", param, v)
	}
	return t, nil
}

// queryInt reads an optional integer parameter, def when absent; one outside [lo, hi] is
// answered 400 saying it must be want. (serve has checked it is text.)
func queryInt(q url.Values, param string, def, lo, hi int64, want string) (int64, error) {
	v := q.Get(param)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, badRequest("%s must be %s, got %q", param, want, v)
	}
	return n, nil
}
