package operate

import (
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/inboxops"
)

// StatusResponse is GET /api/status.
type StatusResponse struct {
	SchemaStatus
	WritesAllowed bool      `json:"writes_allowed"`
	Now           time.Time `json:"now"`
}

// ConsumersResponse is GET /api/consumers.
type ConsumersResponse struct {
	Consumers []ConsumerStats `json:"consumers"`
	// InProcessCounters says whether middlewares were given: without them there are no
	// duplicate rates, only claims.
	InProcessCounters bool `json:"in_process_counters"`
}

// InboxStatsResponse is GET /api/inbox/stats.
type InboxStatsResponse struct {
	Consumers []InboxStats `json:"consumers"`
}

// InboxListResponse is GET /api/inbox: one page of rows in received order. NextAfter, when
// not zero, is the "after" parameter of the next page.
type InboxListResponse struct {
	Rows      []InboxRow `json:"rows"`
	NextAfter int64      `json:"next_after,omitempty"`
}

// MaxListLimit is the largest page GET /api/inbox returns.
const MaxListLimit = 1000

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

// Narrowed reports whether a selector other than Consumer and Statuses names the rows: a skip
// of every matching row of a consumer must say so (ChangeRequest.All, `-all`).
func Narrowed(f inbox.Filter) bool {
	return len(f.IDs) > 0 || len(f.MessageIDs) > 0 || f.OrderingKey != "" || f.Topic != "" || f.ErrorContains != ""
}

var allStatuses = []inbox.Status{inbox.StatusPending, inbox.StatusInProgress, inbox.StatusDone, inbox.StatusFailed, inbox.StatusSkipped}

// ParseStatuses reads statuses given as repeated or comma-separated values, case-insensitive;
// an unknown one is an input error.
func ParseStatuses(values []string) ([]inbox.Status, error) {
	var out []inbox.Status
	for _, v := range values {
		for _, part := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || unicode.IsSpace(r) }) {
			s := inbox.Status(strings.ToUpper(part))
			if !slices.Contains(allStatuses, s) {
				return nil, badRequest("unknown inbox status %q: use %s", part, joinStatuses(allStatuses))
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// CheckChange is the inbox's rule of which statuses the change op ("replay", "skip") may
// select (inboxops.CheckChange), as an input error: the CLI and the page check it before they
// ask, so that a refusal is a usage error and a 400.
func CheckChange(op string, f inbox.Filter) error {
	if err := inboxops.CheckChange(op, f); err != nil {
		return badRequest("%v", err)
	}
	return nil
}

func joinStatuses(ss []inbox.Status) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = string(s)
	}
	return strings.Join(parts, ", ")
}
