// Package inboxops holds the inbox operations that only the CLI and the admin page
// (internal/operate) call: failure groups and the finished-row counts. Their SQL stays in
// package inbox, the table's owner, which sets the functions below when it is linked; ops is
// always an *inbox.Ops (inbox imports this package, so it cannot be named here).
package inboxops

import (
	"context"
	"time"
)

// FailureGroup is the FAILED (parked) rows of one consumer and topic whose errors are the same
// once their volatile parts (UUIDs, addresses, hex, numbers) are replaced: one poison storm is
// one group. The rule and the fingerprint are the schema's (migration 015,
// failure_pattern/failure_fingerprint), so every tool groups alike.
type FailureGroup struct {
	Fingerprint string // 16 hex digits; selects the group in ReplayGroup and SkipGroup
	Consumer    string
	Topic       string
	Pattern     string // the error with <uuid>, <addr>, <hex> and <n> in place of the volatile parts
	Example     string // the last_error of the group's newest row
	Rows        int64
	// FirstSeen and LastSeen are the received_at of the group's oldest and newest row: the inbox
	// keeps no time of failure.
	FirstSeen time.Time
	LastSeen  time.Time
}

// GroupRequest selects the rows of one failure group that ReplayGroup or SkipGroup touch.
type GroupRequest struct {
	// Fingerprint is FailureGroup.Fingerprint. Required.
	Fingerprint string
	// IDs, when given, narrow the group to these rows: pass the IDs a dry run returned to
	// touch exactly those (rows that joined the group since are left alone).
	IDs []int64
	// DryRun lists the rows the operation would change and changes nothing.
	DryRun bool
}

// GroupResult lists the rows an operation on a group changed or, for a dry run, would change.
type GroupResult struct {
	IDs []int64
}

// FinishedStats counts one consumer's finished rows: the dedupe records PruneFinished prunes.
type FinishedStats struct {
	Done    int64
	Skipped int64
}

// Set by package inbox (inbox/internal_ops.go).
var (
	// FailureGroups returns the failure groups of the newest maxRows FAILED rows (0: of all),
	// the largest first, and how many FAILED rows it left out. It only reads. Its cost is in
	// the error patterns, computed once per distinct error text: about a second per 10,000
	// rows whose errors all differ.
	FailureGroups func(ctx context.Context, ops any, maxRows int) (groups []FailureGroup, left int64, err error)
	// ReplayGroup sends the FAILED rows of one group (narrowed by req.IDs) back to PENDING, due
	// now, attempts reset, as Ops.Replay does, and wakes their processors. SkipGroup marks them
	// SKIPPED with reason, as Ops.Skip does. With req.DryRun both only list the rows.
	ReplayGroup func(ctx context.Context, ops any, req GroupRequest) (GroupResult, error)
	SkipGroup   func(ctx context.Context, ops any, req GroupRequest, reason string) (GroupResult, error)
	// CountFinished returns FinishedStats for every consumer with DONE or SKIPPED rows. It
	// scans the table (finished rows are most of it): bound ctx with a deadline.
	CountFinished func(ctx context.Context, ops any) (map[string]FinishedStats, error)
	// CheckChange is the rule Ops.Replay (op "replay") and Ops.Skip ("skip") apply to the
	// statuses of f, an inbox.Filter: never IN_PROGRESS, replay FAILED, PENDING, DONE or
	// SKIPPED, skip FAILED or PENDING. The CLI and the admin page check it before they ask.
	CheckChange func(op string, f any) error
)
