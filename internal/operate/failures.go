package operate

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/failgroup"
	"github.com/wmonce/watermill-once/internal/inboxops"
	"github.com/wmonce/watermill-once/internal/outboxops"
)

// Failure groups, for the page (GET /api/failures, POST /api/failures/act) and `wmonce
// failures`: FAILED (parked) inbox rows (inboxops.FailureGroups), messages the poison queue
// parked (outboxops.ParkedGroups) and rejected outbox rows (outboxops.RejectedGroups), grouped by
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
	in, leftIn, err := inboxops.FailureGroups(ctx, ops, maxRows)
	if err != nil {
		return resp, err
	}
	parked, leftParked, err := outboxops.ParkedGroups(ctx, db, schema, maxRows)
	if err != nil {
		return resp, err
	}
	rejected, leftRejected, err := outboxops.RejectedGroups(ctx, db, schema, maxRows)
	if err != nil {
		return resp, err
	}
	resp.LeftOut = leftIn + leftParked + leftRejected
	out := slices.Concat(inboxGroups(in), parkedGroups(parked), rejectedGroups(rejected))
	slices.SortStableFunc(out, func(a, b FailureGroup) int {
		return cmp.Or(cmp.Compare(b.Rows, a.Rows), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Fingerprint, b.Fingerprint))
	})
	resp.Groups = out
	return resp, nil
}

// inboxGroups are the inbox's failure groups as the page lists them.
func inboxGroups(gs []inboxops.FailureGroup) []FailureGroup {
	out := make([]FailureGroup, 0, len(gs))
	for _, g := range gs {
		out = append(out, FailureGroup{
			Kind: FailureKindInbox, Fingerprint: g.Fingerprint, Consumer: g.Consumer, Topic: g.Topic, Pattern: g.Pattern,
			Example: g.Example, Rows: g.Rows, FirstSeen: g.FirstSeen, LastSeen: g.LastSeen, Actions: groupActions(FailureKindInbox, g.Topic),
		})
	}
	return out
}

// parkedGroups are the parked messages' failure groups as the page lists them.
func parkedGroups(gs []outboxops.ParkedGroup) []FailureGroup {
	out := make([]FailureGroup, 0, len(gs))
	for _, g := range gs {
		out = append(out, FailureGroup{
			Kind: FailureKindParked, Fingerprint: g.Fingerprint, Handler: g.Handler, Topic: g.Topic, Pattern: g.Pattern,
			Example: g.Example, Rows: g.Rows, FirstSeen: g.FirstSeen, LastSeen: g.LastSeen, Actions: groupActions(FailureKindParked, g.Topic),
		})
	}
	return out
}

// rejectedGroups are the rejected outbox rows' failure groups as the page lists them.
func rejectedGroups(gs []outboxops.RejectedGroup) []FailureGroup {
	out := make([]FailureGroup, 0, len(gs))
	for _, g := range gs {
		out = append(out, FailureGroup{
			Kind: FailureKindRejected, Fingerprint: g.Fingerprint, Relay: g.Relay, Topic: g.Topic, Pattern: g.Pattern,
			Example: g.Example, Rows: g.Rows, FirstSeen: g.FirstSeen, LastSeen: g.LastSeen, Actions: groupActions(FailureKindRejected, g.Topic),
		})
	}
	return out
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
// they cannot be replayed (see outboxops.ParkedGroupResult and outboxops.RepublishResult).
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
//
// Its text keeps the "admin:" prefix that the API's 404 and `wmonce failures` have always shown.
var ErrNoFailureGroup = errors.New("admin: no such failure group")

// ActOnFailureGroup checks req and runs its action through the owner's operation, and reports
// the rows its transaction changed (or, for a dry run, would change). Input the caller must
// fix is an error for which IsInputError is true; a group without a row to act on is
// ErrNoFailureGroup. It is the one place that decides which kind takes which action: the
// admin page and `wmonce failures` both call it.
func ActOnFailureGroup(ctx context.Context, db *sql.DB, schema string, req FailureActionRequest) (FailureActionResponse, error) {
	run, err := checkFailureAction(req)
	if err != nil {
		return FailureActionResponse{}, err
	}
	out, err := run(ctx, db, schema, req)
	if err != nil {
		return FailureActionResponse{}, err
	}
	out.Kind, out.Fingerprint, out.Action, out.DryRun = req.Kind, req.Fingerprint, req.Action, req.DryRun
	if out.IDs == nil {
		out.IDs = []int64{}
	}
	out.Rows = len(out.IDs)
	if out.Rows == 0 && len(out.Undecodable) == 0 {
		return FailureActionResponse{}, NoFailureGroup(req.Kind, req.Fingerprint, req.IDs)
	}
	return out, nil
}

// checkFailureAction returns the operation that runs req, or the input error that refuses it.
func checkFailureAction(req FailureActionRequest) (groupAction, error) {
	kind, known := failureKinds[req.Kind]
	run, offered := kind.actions[req.Action]
	refusal, refused := kind.refusals[req.Action]
	return run, FirstError(
		inputErr(failgroup.CheckFingerprint(req.Fingerprint), CheckText("reason", req.Reason)),
		inputIf(slices.ContainsFunc(req.IDs, func(id int64) bool { return id < 1 }), "ids must be positive row ids or outbox offsets, got %v", req.IDs),
		inputIf(req.Action != ActionSkip && req.Reason != "", "reason belongs to skip"),
		inputIf(!known, "kind %q: use %s, %s or %s", req.Kind, FailureKindInbox, FailureKindParked, FailureKindRejected),
		inputIf(refused, "%s", refusal),
		inputIf(!offered, "action %q: %s %s group takes %s", req.Action, article(req.Kind), req.Kind, strings.Join(kind.offered, " or ")),
		inputIf(req.Action == ActionSkip && strings.TrimSpace(req.Reason) == "" && !req.DryRun, "reason is required: it is kept with the skipped rows"))
}

func article(kind string) string {
	if kind == FailureKindInbox {
		return "an"
	}
	return "a"
}

// groupAction runs one action on one group through the owner's operation and fills the rows
// it changed: IDs, and Relay and Undecodable where the owner reports them.
type groupAction func(ctx context.Context, db *sql.DB, schema string, req FailureActionRequest) (FailureActionResponse, error)

// failureKind is what a kind of failure group takes: the actions it offers (in the order
// the page shows them), how each runs, and why the others are refused.
type failureKind struct {
	offered  []string
	actions  map[string]groupAction
	refusals map[string]string
}

// failureKinds is the one table of failure-group actions. Inbox rows are never discarded (a
// deleted row would let a redelivered copy run again); parked messages and rejected outbox
// rows have no status to skip to.
var failureKinds = map[string]failureKind{
	FailureKindInbox: {
		offered: []string{ActionReplay, ActionSkip},
		actions: map[string]groupAction{
			ActionReplay: inboxGroupAction(func(ctx context.Context, ops any, g inboxops.GroupRequest, _ string) (inboxops.GroupResult, error) {
				return inboxops.ReplayGroup(ctx, ops, g)
			}),
			ActionSkip: inboxGroupAction(func(ctx context.Context, ops any, g inboxops.GroupRequest, reason string) (inboxops.GroupResult, error) {
				return inboxops.SkipGroup(ctx, ops, g, reason)
			}),
		},
		refusals: map[string]string{ActionDiscard: "inbox rows are not discarded (a deleted row would let a redelivered copy run again): skip them"},
	},
	FailureKindParked: {
		offered:  []string{ActionReplay, ActionDiscard},
		actions:  map[string]groupAction{ActionReplay: parkedGroupAction(outboxops.ReplayParkedGroup), ActionDiscard: parkedGroupAction(outboxops.DiscardParkedGroup)},
		refusals: map[string]string{ActionSkip: "parked messages are not skipped: replay or discard them"},
	},
	FailureKindRejected: {
		offered:  []string{ActionReplay, ActionDiscard},
		actions:  map[string]groupAction{ActionReplay: rejectedGroupAction(outboxops.RepublishRejectedGroup), ActionDiscard: rejectedGroupAction(outboxops.DiscardRejectedGroup)},
		refusals: map[string]string{ActionSkip: "rejected outbox rows are not skipped: replay (republish) or discard them"},
	},
}

// groupActions are the actions a listed group takes: its kind's, except that a rejected group
// of rows the relay could not decode (Topic "") is only discarded: republished, they would be
// rejected again.
func groupActions(kind, topic string) []string {
	if kind == FailureKindRejected && topic == "" {
		return []string{ActionDiscard}
	}
	return slices.Clone(failureKinds[kind].offered)
}

func inboxGroupAction(act func(context.Context, any, inboxops.GroupRequest, string) (inboxops.GroupResult, error)) groupAction {
	return func(ctx context.Context, db *sql.DB, schema string, req FailureActionRequest) (FailureActionResponse, error) {
		ops, err := inbox.NewOps(db, inbox.OpsConfig{Schema: schema}, nil)
		if err != nil {
			return FailureActionResponse{}, err
		}
		res, err := act(ctx, ops, inboxops.GroupRequest{Fingerprint: req.Fingerprint, IDs: req.IDs, DryRun: req.DryRun}, req.Reason)
		return FailureActionResponse{IDs: res.IDs}, err
	}
}

func parkedGroupAction(act func(context.Context, *sql.DB, string, outboxops.ParkedGroupRequest) (outboxops.ParkedGroupResult, error)) groupAction {
	return func(ctx context.Context, db *sql.DB, schema string, req FailureActionRequest) (FailureActionResponse, error) {
		res, err := act(ctx, db, schema, outboxops.ParkedGroupRequest{Fingerprint: req.Fingerprint, Offsets: req.IDs, DryRun: req.DryRun})
		if errors.Is(err, outboxops.ErrParkedSettled) { // a concurrent action took the copies first
			return FailureActionResponse{}, fmt.Errorf("%w: %w", NoFailureGroup(req.Kind, req.Fingerprint, req.IDs), err)
		}
		return FailureActionResponse{IDs: res.Offsets, Undecodable: res.Unreplayable}, err
	}
}

func rejectedGroupAction(act func(context.Context, *sql.DB, string, outboxops.RejectedGroupRequest) (outboxops.RejectedGroupResult, error)) groupAction {
	return func(ctx context.Context, db *sql.DB, schema string, req FailureActionRequest) (FailureActionResponse, error) {
		res, err := act(ctx, db, schema, outboxops.RejectedGroupRequest{Fingerprint: req.Fingerprint, Offsets: req.IDs, DryRun: req.DryRun})
		return FailureActionResponse{IDs: res.Offsets, Relay: res.Relay, Undecodable: res.Undecodable}, err
	}
}

// FindFailureGroup returns the group with fingerprint fp: among the groups of the newest
// DefaultFailureGroupRows rows of each kind, else among every row's. A fingerprint no group
// has is ErrNoFailureGroup (NoFailureGroup, narrowed by ids).
func FindFailureGroup(ctx context.Context, db *sql.DB, schema, fp string, ids []int64) (FailureGroup, error) {
	for _, maxRows := range []int{DefaultFailureGroupRows, 0} {
		resp, err := ReadFailureGroups(ctx, db, schema, maxRows)
		if err != nil {
			return FailureGroup{}, err
		}
		if i := slices.IndexFunc(resp.Groups, func(g FailureGroup) bool { return g.Fingerprint == fp }); i >= 0 {
			return resp.Groups[i], nil
		}
		if resp.LeftOut == 0 {
			break
		}
	}
	return FailureGroup{}, NoFailureGroup("", fp, ids)
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
