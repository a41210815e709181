package operate

import (
	"fmt"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/inbox"
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

// Narrowed reports whether a selector other than Consumer and Statuses names the rows.
func (c ChangeRequest) Narrowed() bool {
	return len(c.IDs) > 0 || len(c.MessageIDs) > 0 || c.OrderingKey != "" || c.Topic != "" || c.ErrorContains != ""
}

var allStatuses = []inbox.Status{inbox.StatusPending, inbox.StatusInProgress, inbox.StatusDone, inbox.StatusFailed, inbox.StatusSkipped}

// ParseStatuses reads statuses given as repeated or comma-separated values, case-insensitive.
// allowed nil accepts every status.
func ParseStatuses(values []string, allowed []inbox.Status) ([]inbox.Status, error) {
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
