package admin

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/operate"
)

func (h *Handler) status(ctx context.Context, _ *http.Request) (any, error) {
	s, err := operate.ReadSchemaStatus(ctx, h.db, h.config.Schema)
	if err != nil {
		return nil, err
	}
	return operate.StatusResponse{SchemaStatus: s, WritesAllowed: h.config.AllowWrites, Now: time.Now().UTC()}, nil
}

func (h *Handler) consumers(ctx context.Context, _ *http.Request) (any, error) {
	cs, err := operate.ReadConsumers(ctx, h.db, h.config.Schema, h.config.Middlewares)
	if err != nil {
		return nil, err
	}
	return operate.ConsumersResponse{Consumers: cs, InProcessCounters: len(h.config.Middlewares) > 0}, nil
}

func (h *Handler) inboxStats(ctx context.Context, _ *http.Request) (any, error) {
	s, err := operate.ReadInbox(ctx, h.db, h.config.Schema)
	if err != nil {
		return nil, err
	}
	return operate.InboxStatsResponse{Consumers: s}, nil
}

// GET /api/inbox?consumer=C&status=FAILED[,PENDING]&key=K&message=M&topic=T&error=E&received_after=T&received_before=T&after=ID&limit=N
func (h *Handler) inboxList(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	f := inbox.Filter{Consumer: q.Get("consumer"), OrderingKey: q.Get("key"), Topic: q.Get("topic"), ErrorContains: q.Get("error")}
	if strings.TrimSpace(f.Consumer) == "" {
		return nil, badRequest("the consumer parameter is required (GET /api/inbox/stats lists the consumers)")
	}
	if err := operate.FirstError(operate.CheckConsumer("consumer", f.Consumer), operate.CheckText("key", f.OrderingKey), operate.CheckText("message", q.Get("message")),
		operate.CheckText("topic", f.Topic), operate.CheckText("error", f.ErrorContains)); err != nil {
		return nil, badRequest("%v", err)
	}
	statuses, err := operate.ParseStatuses(q["status"], nil)
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
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 || limit > operate.MaxListLimit {
			return nil, badRequest("limit must be an integer between 1 and %d, got %q", operate.MaxListLimit, l)
		}
	}
	rows, err := h.ops.List(ctx, f, limit)
	if err != nil {
		return nil, err
	}
	out := operate.InboxListResponse{Rows: make([]operate.InboxRow, 0, len(rows))}
	for _, row := range rows {
		out.Rows = append(out.Rows, operate.NewInboxRow(row, false))
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
	return operate.NewInboxRow(row, true), nil
}

func (h *Handler) outbox(ctx context.Context, _ *http.Request) (any, error) {
	return operate.ReadOutbox(ctx, h.db, h.config.Schema)
}

// GET /api/dedupe?consumer=C&message=M
func (h *Handler) dedupe(ctx context.Context, r *http.Request) (any, error) {
	consumer, key := r.URL.Query().Get("consumer"), r.URL.Query().Get("message")
	if consumer == "" || key == "" {
		return nil, badRequest("both consumer and message are required")
	}
	if err := operate.FirstError(operate.CheckConsumer("consumer", consumer), operate.CheckText("message", key)); err != nil {
		return nil, badRequest("%v", err)
	}
	return operate.LookupProcessed(ctx, h.db, h.config.Schema, consumer, key)
}

func readChange(r *http.Request, allowed []inbox.Status) (operate.ChangeRequest, inbox.Filter, error) {
	var c operate.ChangeRequest
	if err := decodeBody(r, &c); err != nil {
		return c, inbox.Filter{}, err
	}
	if strings.TrimSpace(c.Consumer) == "" {
		return c, inbox.Filter{}, badRequest("consumer is required")
	}
	if err := operate.FirstError(operate.CheckConsumer("consumer", c.Consumer), operate.CheckText("message_ids", c.MessageIDs...), operate.CheckText("ordering_key", c.OrderingKey),
		operate.CheckText("topic", c.Topic), operate.CheckText("error_contains", c.ErrorContains), operate.CheckText("reason", c.Reason)); err != nil {
		return c, inbox.Filter{}, badRequest("%v", err)
	}
	statuses, err := operate.ParseStatuses(c.Statuses, allowed)
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
	return operate.ChangeResponse{Action: "replay", Consumer: c.Consumer, DryRun: c.DryRun, Rows: n}, nil
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
	if !c.Narrowed() && !c.All {
		return nil, badRequest("select rows with ids, message_ids, ordering_key, topic or error_contains, or set all to skip every matching row of %q", c.Consumer)
	}
	n, err := h.ops.Skip(ctx, f, c.Reason, c.DryRun)
	if err != nil {
		return nil, err
	}
	if !c.DryRun {
		h.logger.Info("Inbox rows skipped from the admin page", watermill.LogFields{"consumer": c.Consumer, "rows": n, "reason": c.Reason, "remote": r.RemoteAddr})
	}
	return operate.ChangeResponse{Action: "skip", Consumer: c.Consumer, DryRun: c.DryRun, Rows: n}, nil
}
