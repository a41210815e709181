package admin

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/outbox"
)

// Failure groups, for the page (GET /api/failures, POST /api/failures/act) and `wmonce
// failures`: FAILED (parked) inbox rows (inbox.Ops.FailureGroups), messages the poison queue
// parked (outbox.ParkedGroups) and rejected outbox rows (outbox.RejectedGroups), grouped by
// the schema's fingerprint, with bulk actions on a group.

// Kinds of failure group.
const (
	FailureKindInbox    = "inbox"    // FAILED inbox rows of one consumer
	FailureKindParked   = "parked"   // messages the poison queue parked (ParkingPublisher), of one handler
	FailureKindRejected = "rejected" // rows of outbox_rejected of one relay
)

// Actions on a failure group. Replay sends inbox rows back to PENDING, stores parked messages
// again for the topic they were consumed from, and republishes rejected outbox rows; skip marks
// inbox rows SKIPPED (kept as dedupe records); discard sets parked messages aside and deletes
// rejected outbox rows. Inbox rows are never discarded: a deleted row would let a redelivered
// copy run again.
const (
	ActionReplay  = "replay"
	ActionSkip    = "skip"
	ActionDiscard = "discard"
)

// FailureGroup is one group of failed rows with the same fingerprint: where they failed
// (Consumer for the inbox, Handler for parked messages, Relay for rejected rows; Topic) and
// their error with its volatile parts replaced (Pattern). FirstSeen and LastSeen are the
// received_at of the oldest and newest inbox row (the inbox keeps no failure time), when the
// first and last message was parked, or the first and last rejected_at. Actions are
// those the group takes (a rejected group of rows the relay could not decode, Topic "", is
// only discarded: republished, they would be rejected again).
type FailureGroup struct {
	Kind        string    `json:"kind"`
	Fingerprint string    `json:"fingerprint"`
	Consumer    string    `json:"consumer,omitempty"`
	Handler     string    `json:"handler,omitempty"`
	Relay       string    `json:"relay,omitempty"`
	Topic       string    `json:"topic"`
	Pattern     string    `json:"pattern"`
	Example     string    `json:"example"`
	Rows        int64     `json:"rows"`
	FirstSeen   time.Time `json:"first_seen"`
	LastSeen    time.Time `json:"last_seen"`
	Actions     []string  `json:"actions"`
}

// DefaultFailureGroupRows is how many of the newest rows of each kind GET /api/failures and
// `wmonce failures` group by default: the error patterns cost about a second per 10,000 rows
// whose errors all differ (this project's test machine, under load), and a page refresh must
// not take minutes in a poison storm. Actions on a group always reach all its rows.
const DefaultFailureGroupRows = 10000

// FailureGroupsResponse is GET /api/failures: the groups, the largest first, of the newest
// MaxRows rows of each kind (0: every row). LeftOut counts the older rows not grouped; a
// group's Rows counts only the rows grouped.
type FailureGroupsResponse struct {
	Groups  []FailureGroup `json:"groups"`
	MaxRows int            `json:"max_rows"`
	LeftOut int64          `json:"left_out"`
}

// ReadFailureGroups returns the inbox's failure groups, the parked messages' and the rejected
// outbox rows', each over its newest maxRows rows (0: all), the largest first.
func ReadFailureGroups(ctx context.Context, db *sql.DB, schema string, maxRows int) (FailureGroupsResponse, error) {
	resp := FailureGroupsResponse{MaxRows: maxRows}
	ops, err := inbox.NewOps(db, inbox.OpsConfig{Schema: schema}, nil)
	if err != nil {
		return resp, err
	}
	in, leftIn, err := ops.FailureGroups(ctx, maxRows)
	if err != nil {
		return resp, err
	}
	parked, leftParked, err := outbox.ParkedGroups(ctx, db, schema, maxRows)
	if err != nil {
		return resp, err
	}
	rejected, leftRejected, err := outbox.RejectedGroups(ctx, db, schema, maxRows)
	if err != nil {
		return resp, err
	}
	resp.LeftOut = leftIn + leftParked + leftRejected
	out := make([]FailureGroup, 0, len(in)+len(parked)+len(rejected))
	for _, g := range in {
		out = append(out, FailureGroup{
			Kind: FailureKindInbox, Fingerprint: g.Fingerprint, Consumer: g.Consumer, Topic: g.Topic, Pattern: g.Pattern,
			Example: g.Example, Rows: g.Rows, FirstSeen: g.FirstSeen, LastSeen: g.LastSeen, Actions: []string{ActionReplay, ActionSkip},
		})
	}
	for _, g := range parked {
		out = append(out, FailureGroup{
			Kind: FailureKindParked, Fingerprint: g.Fingerprint, Handler: g.Handler, Topic: g.Topic, Pattern: g.Pattern,
			Example: g.Example, Rows: g.Rows, FirstSeen: g.FirstSeen, LastSeen: g.LastSeen, Actions: []string{ActionReplay, ActionDiscard},
		})
	}
	for _, g := range rejected {
		actions := []string{ActionReplay, ActionDiscard}
		if g.Topic == "" { // rows the relay could not decode: republished, they would only be rejected again
			actions = []string{ActionDiscard}
		}
		out = append(out, FailureGroup{
			Kind: FailureKindRejected, Fingerprint: g.Fingerprint, Relay: g.Relay, Topic: g.Topic, Pattern: g.Pattern,
			Example: g.Example, Rows: g.Rows, FirstSeen: g.FirstSeen, LastSeen: g.LastSeen, Actions: actions,
		})
	}
	slices.SortStableFunc(out, func(a, b FailureGroup) int {
		return cmp.Or(cmp.Compare(b.Rows, a.Rows), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Fingerprint, b.Fingerprint))
	})
	resp.Groups = out
	return resp, nil
}

// FailureActionRequest is the body of POST /api/failures/act: one action on one group. IDs
// narrow the group to the rows a dry run listed (inbox row ids, or outbox offsets for a
// rejected group), so that the action touches exactly those.
type FailureActionRequest struct {
	Kind        string  `json:"kind"`
	Fingerprint string  `json:"fingerprint"`
	Action      string  `json:"action"`
	IDs         []int64 `json:"ids,omitempty"`
	// Reason is required for skip (but not for its dry run) and kept in the rows' last_error.
	Reason string `json:"reason,omitempty"`
	DryRun bool   `json:"dry_run"`
}

// FailureActionResponse lists the rows the action changed or, for a dry run, would change:
// inbox row ids, outbox offsets of parked copies, or outbox offsets of Relay's rejected rows.
// Undecodable (replay of a parked or rejected group) lists offsets left in the group because
// they cannot be replayed (see outbox.ParkedGroupResult and outbox.RepublishResult).
type FailureActionResponse struct {
	Kind        string  `json:"kind"`
	Fingerprint string  `json:"fingerprint"`
	Action      string  `json:"action"`
	DryRun      bool    `json:"dry_run"`
	Rows        int     `json:"rows"`
	IDs         []int64 `json:"ids"`
	Relay       string  `json:"relay,omitempty"`
	Undecodable []int64 `json:"undecodable,omitempty"`
}

// ErrNoFailureGroup is returned (wrapped) by ActOnFailureGroup when the group has no row the
// action could take: an unknown fingerprint, rows handled meanwhile (another replay, skip or
// discard committed first), or IDs outside the group. The API answers it 404 and `wmonce
// failures` exits 1: an action that changed nothing is never reported as done.
var ErrNoFailureGroup = errors.New("admin: no such failure group")

// ActOnFailureGroup checks req and runs its action through the owner's operation, and reports
// the rows its transaction changed (or, for a dry run, would change). Input the caller must
// fix is an error for which IsInputError is true; a group without a row to act on is
// ErrNoFailureGroup.
func ActOnFailureGroup(ctx context.Context, db *sql.DB, schema string, req FailureActionRequest) (FailureActionResponse, error) {
	if err := outbox.CheckFingerprint(req.Fingerprint); err != nil {
		return FailureActionResponse{}, badRequest("%v", err)
	}
	if err := CheckText("reason", req.Reason); err != nil {
		return FailureActionResponse{}, badRequest("%v", err)
	}
	for _, id := range req.IDs {
		if id < 1 {
			return FailureActionResponse{}, badRequest("ids must be positive row ids or outbox offsets, got %d", id)
		}
	}
	if req.Action != ActionSkip && req.Reason != "" {
		return FailureActionResponse{}, badRequest("reason belongs to skip")
	}
	out := FailureActionResponse{Kind: req.Kind, Fingerprint: req.Fingerprint, Action: req.Action, DryRun: req.DryRun}
	switch req.Kind {
	case FailureKindInbox:
		ops, err := inbox.NewOps(db, inbox.OpsConfig{Schema: schema}, nil)
		if err != nil {
			return FailureActionResponse{}, err
		}
		g := inbox.GroupRequest{Fingerprint: req.Fingerprint, IDs: req.IDs, DryRun: req.DryRun}
		var res inbox.GroupResult
		switch req.Action {
		case ActionReplay:
			res, err = ops.ReplayGroup(ctx, g)
		case ActionSkip:
			if strings.TrimSpace(req.Reason) == "" && !req.DryRun {
				return FailureActionResponse{}, badRequest("reason is required: it is kept with the skipped rows")
			}
			res, err = ops.SkipGroup(ctx, g, req.Reason)
		case ActionDiscard:
			return FailureActionResponse{}, badRequest("inbox rows are not discarded (a deleted row would let a redelivered copy run again): skip them")
		default:
			return FailureActionResponse{}, badRequest("action %q: an inbox group takes replay or skip", req.Action)
		}
		if err != nil {
			return FailureActionResponse{}, err
		}
		out.IDs = res.IDs
	case FailureKindParked:
		g := outbox.ParkedGroupRequest{Fingerprint: req.Fingerprint, Offsets: req.IDs, DryRun: req.DryRun}
		var res outbox.ParkedGroupResult
		var err error
		switch req.Action {
		case ActionReplay:
			res, err = outbox.ReplayParkedGroup(ctx, db, schema, g)
		case ActionDiscard:
			res, err = outbox.DiscardParkedGroup(ctx, db, schema, g)
		case ActionSkip:
			return FailureActionResponse{}, badRequest("parked messages are not skipped: replay or discard them")
		default:
			return FailureActionResponse{}, badRequest("action %q: a parked group takes replay or discard", req.Action)
		}
		if errors.Is(err, outbox.ErrParkedSettled) { // a concurrent action took the copies first
			return FailureActionResponse{}, fmt.Errorf("%w: %w", NoFailureGroup(req.Kind, req.Fingerprint, req.IDs), err)
		}
		if err != nil {
			return FailureActionResponse{}, err
		}
		out.IDs, out.Undecodable = res.Offsets, res.Unreplayable
	case FailureKindRejected:
		g := outbox.RejectedGroupRequest{Fingerprint: req.Fingerprint, Offsets: req.IDs, DryRun: req.DryRun}
		var res outbox.RejectedGroupResult
		var err error
		switch req.Action {
		case ActionReplay:
			res, err = outbox.RepublishRejectedGroup(ctx, db, schema, g)
		case ActionDiscard:
			res, err = outbox.DiscardRejectedGroup(ctx, db, schema, g)
		case ActionSkip:
			return FailureActionResponse{}, badRequest("rejected outbox rows are not skipped: replay (republish) or discard them")
		default:
			return FailureActionResponse{}, badRequest("action %q: a rejected group takes replay or discard", req.Action)
		}
		if err != nil {
			return FailureActionResponse{}, err
		}
		out.IDs, out.Relay, out.Undecodable = res.Offsets, res.Relay, res.Undecodable
	default:
		return FailureActionResponse{}, badRequest("kind %q: use %s, %s or %s", req.Kind, FailureKindInbox, FailureKindParked, FailureKindRejected)
	}
	if out.IDs == nil {
		out.IDs = []int64{}
	}
	out.Rows = len(out.IDs)
	if out.Rows == 0 && len(out.Undecodable) == 0 {
		return FailureActionResponse{}, NoFailureGroup(req.Kind, req.Fingerprint, req.IDs)
	}
	return out, nil
}

// NoFailureGroup is the ErrNoFailureGroup error for a group of kind (any kind when "") and
// fingerprint fp, narrowed by ids.
func NoFailureGroup(kind, fp string, ids []int64) error {
	what := "failure group"
	if kind != "" {
		what = kind + " group"
	}
	narrowed := ""
	if len(ids) > 0 {
		narrowed = fmt.Sprintf(" with rows %v", ids)
	}
	return fmt.Errorf("%w: no %s has fingerprint %s%s (unknown, or its rows were replayed, skipped or discarded meanwhile)",
		ErrNoFailureGroup, what, fp, narrowed)
}

// GET /api/failures[?max_rows=N] (N: 0 for every row; default DefaultFailureGroupRows)
func (h *Handler) failureGroups(ctx context.Context, r *http.Request) (any, error) {
	maxRows := DefaultFailureGroupRows
	if v := r.URL.Query().Get("max_rows"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, badRequest("max_rows must be a non-negative integer (0: every row), got %q", v)
		}
		maxRows = n
	}
	return ReadFailureGroups(ctx, h.db, h.config.Schema, maxRows)
}

// POST /api/failures/act
func (h *Handler) failureAct(ctx context.Context, r *http.Request) (any, error) {
	var req FailureActionRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	out, err := ActOnFailureGroup(ctx, h.db, h.config.Schema, req)
	if errors.Is(err, ErrNoFailureGroup) {
		return nil, &apiError{status: http.StatusNotFound, msg: err.Error()}
	}
	if err != nil {
		return nil, err
	}
	if !req.DryRun {
		h.logger.Info("Failure group changed from the admin page", watermill.LogFields{
			"kind": req.Kind, "fingerprint": req.Fingerprint, "action": req.Action, "rows": out.Rows, "ids": out.IDs, "remote": r.RemoteAddr,
		})
	}
	return out, nil
}
