package admin

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/inbox"
)

// StatusResponse is GET /api/status.
type StatusResponse struct {
	SchemaStatus
	WritesAllowed bool      `json:"writes_allowed"`
	Now           time.Time `json:"now"`
}

func (h *Handler) status(ctx context.Context, _ *http.Request) (any, error) {
	s, err := ReadSchemaStatus(ctx, h.db, h.config.Schema)
	if err != nil {
		return nil, err
	}
	return StatusResponse{SchemaStatus: s, WritesAllowed: h.config.AllowWrites, Now: time.Now().UTC()}, nil
}

// ConsumersResponse is GET /api/consumers.
type ConsumersResponse struct {
	Consumers []ConsumerStats `json:"consumers"`
	// InProcessCounters says whether middlewares were given: without them there are no
	// duplicate rates, only claims.
	InProcessCounters bool `json:"in_process_counters"`
}

func (h *Handler) consumers(ctx context.Context, _ *http.Request) (any, error) {
	cs, err := ReadConsumers(ctx, h.db, h.config.Schema, h.config.Middlewares)
	if err != nil {
		return nil, err
	}
	return ConsumersResponse{Consumers: cs, InProcessCounters: len(h.config.Middlewares) > 0}, nil
}

// InboxStatsResponse is GET /api/inbox/stats.
type InboxStatsResponse struct {
	Consumers []InboxStats `json:"consumers"`
}

func (h *Handler) inboxStats(ctx context.Context, _ *http.Request) (any, error) {
	s, err := ReadInbox(ctx, h.db, h.config.Schema)
	if err != nil {
		return nil, err
	}
	return InboxStatsResponse{Consumers: s}, nil
}

// InboxListResponse is GET /api/inbox: one page of rows in received order. NextAfter, when
// not zero, is the "after" parameter of the next page.
type InboxListResponse struct {
	Rows      []InboxRow `json:"rows"`
	NextAfter int64      `json:"next_after,omitempty"`
}

// MaxListLimit is the largest page GET /api/inbox returns.
const MaxListLimit = 1000

// GET /api/inbox?consumer=C&status=FAILED[,PENDING]&key=K&message=M&topic=T&error=E&received_after=T&received_before=T&after=ID&limit=N
func (h *Handler) inboxList(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	f := inbox.Filter{Consumer: q.Get("consumer"), OrderingKey: q.Get("key"), Topic: q.Get("topic"), ErrorContains: q.Get("error")}
	if strings.TrimSpace(f.Consumer) == "" {
		return nil, badRequest("the consumer parameter is required (GET /api/inbox/stats lists the consumers)")
	}
	if err := firstError(CheckConsumer("consumer", f.Consumer), CheckText("key", f.OrderingKey), CheckText("message", q.Get("message")),
		CheckText("topic", f.Topic), CheckText("error", f.ErrorContains)); err != nil {
		return nil, badRequest("%v", err)
	}
	statuses, err := parseStatuses(q["status"], nil)
	if err != nil {
		return nil, err
	}
	f.Statuses = statuses
	if f.ReceivedAfter, err = parseTime(q, "received_after"); err != nil {
		return nil, err
	}
	if f.ReceivedBefore, err = parseTime(q, "received_before"); err != nil {
		return nil, err
	}
	if m := q.Get("message"); m != "" {
		f.MessageIDs = []string{m}
	}
	if a := q.Get("after"); a != "" {
		if f.AfterID, err = strconv.ParseInt(a, 10, 64); err != nil || f.AfterID < 0 {
			return nil, badRequest("after must be a row id (a non-negative integer), got %q", a)
		}
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 || limit > MaxListLimit {
			return nil, badRequest("limit must be an integer between 1 and %d, got %q", MaxListLimit, l)
		}
	}
	rows, err := h.ops.List(ctx, f, limit)
	if err != nil {
		return nil, err
	}
	out := InboxListResponse{Rows: make([]InboxRow, 0, len(rows))}
	for _, row := range rows {
		out.Rows = append(out.Rows, NewInboxRow(row, false))
	}
	if len(rows) == limit {
		out.NextAfter = rows[len(rows)-1].ID
	}
	return out, nil
}

// GET /api/inbox/{id}
func (h *Handler) inboxInspect(ctx context.Context, r *http.Request) (any, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		return nil, badRequest("inbox row id must be a positive integer, got %q", r.PathValue("id"))
	}
	row, err := h.ops.Inspect(ctx, id)
	if err != nil {
		return nil, err
	}
	return NewInboxRow(row, true), nil
}

func (h *Handler) outbox(ctx context.Context, _ *http.Request) (any, error) {
	return ReadOutbox(ctx, h.db, h.config.Schema)
}

// GET /api/dedupe?consumer=C&message=M
func (h *Handler) dedupe(ctx context.Context, r *http.Request) (any, error) {
	consumer, key := r.URL.Query().Get("consumer"), r.URL.Query().Get("message")
	if consumer == "" || key == "" {
		return nil, badRequest("both consumer and message are required")
	}
	if err := firstError(CheckConsumer("consumer", consumer), CheckText("message", key)); err != nil {
		return nil, badRequest("%v", err)
	}
	return LookupProcessed(ctx, h.db, h.config.Schema, consumer, key)
}

// ChangeRequest is the body of POST /api/inbox/replay and /api/inbox/skip. Consumer is
// required; the other selectors narrow the rows (Statuses defaults to FAILED).
type ChangeRequest struct {
	Consumer      string   `json:"consumer"`
	Statuses      []string `json:"statuses,omitempty"`
	IDs           []int64  `json:"ids,omitempty"`
	MessageIDs    []string `json:"message_ids,omitempty"`
	OrderingKey   string   `json:"ordering_key,omitempty"`
	Topic         string   `json:"topic,omitempty"`
	ErrorContains string   `json:"error_contains,omitempty"`
	// All must be set to skip every matching row of the consumer when no ids, message ids,
	// ordering key, topic or error text narrow the selection.
	All bool `json:"all,omitempty"`
	// Reason is required for skip and kept in the rows' last_error.
	Reason string `json:"reason,omitempty"`
	// DryRun counts the rows that would change and changes nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// ChangeResponse says how many rows a replay or skip changed (or, for a dry run, matched).
type ChangeResponse struct {
	Action   string `json:"action"`
	Consumer string `json:"consumer"`
	DryRun   bool   `json:"dry_run"`
	Rows     int    `json:"rows"`
}

func (c ChangeRequest) narrowed() bool {
	return len(c.IDs) > 0 || len(c.MessageIDs) > 0 || c.OrderingKey != "" || c.Topic != "" || c.ErrorContains != ""
}

func readChange(r *http.Request, allowed []inbox.Status) (ChangeRequest, inbox.Filter, error) {
	var c ChangeRequest
	if err := decodeBody(r, &c); err != nil {
		return c, inbox.Filter{}, err
	}
	if strings.TrimSpace(c.Consumer) == "" {
		return c, inbox.Filter{}, badRequest("consumer is required")
	}
	if err := firstError(CheckConsumer("consumer", c.Consumer), CheckText("message_ids", c.MessageIDs...), CheckText("ordering_key", c.OrderingKey),
		CheckText("topic", c.Topic), CheckText("error_contains", c.ErrorContains), CheckText("reason", c.Reason)); err != nil {
		return c, inbox.Filter{}, badRequest("%v", err)
	}
	statuses, err := parseStatuses(c.Statuses, allowed)
	if err != nil {
		return c, inbox.Filter{}, err
	}
	for _, id := range c.IDs {
		if id < 1 {
			return c, inbox.Filter{}, badRequest("ids must be positive row ids, got %d", id)
		}
	}
	return c, inbox.Filter{
		Consumer: c.Consumer, Statuses: statuses, IDs: c.IDs, MessageIDs: c.MessageIDs,
		OrderingKey: c.OrderingKey, Topic: c.Topic, ErrorContains: c.ErrorContains,
	}, nil
}

// POST /api/inbox/replay
func (h *Handler) replay(ctx context.Context, r *http.Request) (any, error) {
	c, f, err := readChange(r, []inbox.Status{inbox.StatusFailed, inbox.StatusPending, inbox.StatusDone, inbox.StatusSkipped})
	if err != nil {
		return nil, err
	}
	if c.Reason != "" || c.All {
		return nil, badRequest("reason and all belong to skip; replay takes the selectors and dry_run")
	}
	n, err := h.ops.Replay(ctx, f, c.DryRun)
	if err != nil {
		return nil, err
	}
	if !c.DryRun {
		h.logger.Info("Inbox rows replayed from the admin page", watermill.LogFields{"consumer": c.Consumer, "rows": n, "remote": r.RemoteAddr})
	}
	return ChangeResponse{Action: "replay", Consumer: c.Consumer, DryRun: c.DryRun, Rows: n}, nil
}

// POST /api/inbox/skip
func (h *Handler) skip(ctx context.Context, r *http.Request) (any, error) {
	c, f, err := readChange(r, []inbox.Status{inbox.StatusFailed, inbox.StatusPending})
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(c.Reason) == "" {
		return nil, badRequest("reason is required: it is kept with the skipped rows")
	}
	if !c.narrowed() && !c.All {
		return nil, badRequest("select rows with ids, message_ids, ordering_key, topic or error_contains, or set all to skip every matching row of %q", c.Consumer)
	}
	n, err := h.ops.Skip(ctx, f, c.Reason, c.DryRun)
	if err != nil {
		return nil, err
	}
	if !c.DryRun {
		h.logger.Info("Inbox rows skipped from the admin page", watermill.LogFields{"consumer": c.Consumer, "rows": n, "reason": c.Reason, "remote": r.RemoteAddr})
	}
	return ChangeResponse{Action: "skip", Consumer: c.Consumer, DryRun: c.DryRun, Rows: n}, nil
}

var allStatuses = []inbox.Status{inbox.StatusPending, inbox.StatusInProgress, inbox.StatusDone, inbox.StatusFailed, inbox.StatusSkipped}

// parseStatuses reads statuses given as repeated or comma-separated values, case-insensitive.
// allowed nil accepts every status.
func parseStatuses(values []string, allowed []inbox.Status) ([]inbox.Status, error) {
	if allowed == nil {
		allowed = allStatuses
	}
	var out []inbox.Status
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			part = strings.ToUpper(strings.TrimSpace(part))
			if part == "" {
				continue
			}
			s, err := ParseStatus(part)
			if err != nil {
				return nil, badRequest("%v", err)
			}
			ok := false
			for _, a := range allowed {
				ok = ok || a == s
			}
			if !ok {
				if s == inbox.StatusInProgress {
					return nil, badRequest("IN_PROGRESS rows belong to a worker and cannot be changed: wait for it, or its lease, to settle them")
				}
				return nil, badRequest("status %s cannot be used here (allowed: %s)", s, joinStatuses(allowed))
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// ParseStatus reads an inbox status name, case-insensitive.
func ParseStatus(s string) (inbox.Status, error) {
	up := inbox.Status(strings.ToUpper(strings.TrimSpace(s)))
	for _, a := range allStatuses {
		if a == up {
			return a, nil
		}
	}
	return "", fmt.Errorf("unknown inbox status %q: use %s", s, joinStatuses(allStatuses))
}

func joinStatuses(ss []inbox.Status) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = string(s)
	}
	return strings.Join(parts, ", ")
}
