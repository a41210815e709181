package admin

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
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
	f, limit, err := listFilter(r.URL.Query())
	if err != nil {
		return nil, err
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

// listFilter reads the selection and page size of GET /api/inbox. (serve has checked that
// every parameter is text.)
func listFilter(q url.Values) (inbox.Filter, int, error) {
	f := inbox.Filter{Consumer: q.Get("consumer"), OrderingKey: q.Get("key"), Topic: q.Get("topic"), ErrorContains: q.Get("error")}
	if m := q.Get("message"); m != "" {
		f.MessageIDs = []string{m}
	}
	var errAfter, errBefore, errID, errLimit, errStatus error
	f.Statuses, errStatus = operate.ParseStatuses(q["status"])
	f.ReceivedAfter, errAfter = parseTime(q, "received_after")
	f.ReceivedBefore, errBefore = parseTime(q, "received_before")
	f.AfterID, errID = queryInt(q, "after", 0, 0, math.MaxInt64, "a row id (a non-negative integer)")
	limit, errLimit := queryInt(q, "limit", 100, 1, operate.MaxListLimit, fmt.Sprintf("an integer between 1 and %d", operate.MaxListLimit))
	return f, int(limit), operate.FirstError(
		badRequestIf(strings.TrimSpace(f.Consumer) == "", "the consumer parameter is required (GET /api/inbox/stats lists the consumers)"),
		inputError(operate.CheckConsumer("consumer", f.Consumer)),
		errStatus, errAfter, errBefore, errID, errLimit)
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

// readChange reads the body of a replay or skip and the filter it selects, checked by the
// inbox's rule of what op may change (operate.CheckChange), as the CLI checks it.
func readChange(r *http.Request, op string) (operate.ChangeRequest, inbox.Filter, error) {
	var c operate.ChangeRequest
	if err := decodeBody(r, &c); err != nil {
		return c, inbox.Filter{}, err
	}
	statuses, err := operate.ParseStatuses(c.Statuses)
	f := inbox.Filter{
		Consumer: c.Consumer, Statuses: statuses, IDs: c.IDs, MessageIDs: c.MessageIDs,
		OrderingKey: c.OrderingKey, Topic: c.Topic, ErrorContains: c.ErrorContains,
	}
	return c, f, operate.FirstError(
		badRequestIf(strings.TrimSpace(c.Consumer) == "", "consumer is required"),
		inputError(operate.CheckConsumer("consumer", c.Consumer), operate.CheckText("message_ids", c.MessageIDs...), operate.CheckText("ordering_key", c.OrderingKey),
			operate.CheckText("topic", c.Topic), operate.CheckText("error_contains", c.ErrorContains), operate.CheckText("reason", c.Reason)),
		err,
		badRequestIf(slices.ContainsFunc(c.IDs, func(id int64) bool { return id < 1 }), "ids must be positive row ids, got %v", c.IDs),
		operate.CheckChange(op, f),
		inboxChanges[op].check(c, f))
}

// inboxChanges are the checks of replay and skip beyond the selection, and what each runs.
var inboxChanges = map[string]struct {
	check func(c operate.ChangeRequest, f inbox.Filter) error
	run   func(ctx context.Context, ops *inbox.Ops, c operate.ChangeRequest, f inbox.Filter) (int, error)
	log   string
}{
	"replay": {
		check: func(c operate.ChangeRequest, _ inbox.Filter) error {
			return badRequestIf(c.Reason != "" || c.All, "reason and all belong to skip; replay takes the selectors and dry_run")
		},
		run: func(ctx context.Context, ops *inbox.Ops, c operate.ChangeRequest, f inbox.Filter) (int, error) {
			return ops.Replay(ctx, f, c.DryRun)
		},
		log: "Inbox rows replayed from the admin page",
	},
	"skip": {
		check: func(c operate.ChangeRequest, f inbox.Filter) error {
			return operate.FirstError(badRequestIf(strings.TrimSpace(c.Reason) == "", "reason is required: it is kept with the skipped rows"),
				badRequestIf(!operate.Narrowed(f) && !c.All, "select rows with ids, message_ids, ordering_key, topic or error_contains, or set all to skip every matching row of %q", c.Consumer))
		},
		run: func(ctx context.Context, ops *inbox.Ops, c operate.ChangeRequest, f inbox.Filter) (int, error) {
			return ops.Skip(ctx, f, c.Reason, c.DryRun)
		},
		log: "Inbox rows skipped from the admin page",
	},
}

// POST /api/inbox/replay and /api/inbox/skip
func (h *Handler) inboxChange(op string) apiFunc {
	return func(ctx context.Context, r *http.Request) (any, error) {
		c, f, err := readChange(r, op)
		if err != nil {
			return nil, err
		}
		n, err := inboxChanges[op].run(ctx, h.ops, c, f)
		if err != nil {
			return nil, err
		}
		if !c.DryRun {
			h.logger.Info(inboxChanges[op].log, watermill.LogFields{"consumer": c.Consumer, "rows": n, "reason": c.Reason, "remote": r.RemoteAddr})
		}
		return operate.ChangeResponse{Action: op, Consumer: c.Consumer, DryRun: c.DryRun, Rows: n}, nil
	}
}
