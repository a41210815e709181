package operate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/outbox"
)

// The outbox writes of the page and of `wmonce outbox`: republishing rejected rows and
// forgetting a retired relay. Both go through package outbox.

// RepublishRequest is the body of POST /api/outbox/republish: the rejected rows of one relay
// to store again in the outbox (outboxops.RepublishRejected).
type RepublishRequest struct {
	Relay string `json:"relay"`
	// Offsets are the rows' outbox offsets; All selects every row the relay rejected.
	Offsets []int64 `json:"offsets,omitempty"`
	All     bool    `json:"all,omitempty"`
	// RemoveMetadata names metadata keys removed before the rows are stored again (a key the
	// broker reserves).
	RemoveMetadata []string `json:"remove_metadata,omitempty"`
	DryRun         bool     `json:"dry_run"`
}

// RepublishResponse says how many rows were (or, for a dry run, would be) stored again and
// their offsets, as the transaction that moved them saw them (a row another call republished
// first is not counted), and which selected rows stay rejected because they cannot be decoded.
type RepublishResponse struct {
	Relay       string  `json:"relay"`
	DryRun      bool    `json:"dry_run"`
	Republished int     `json:"republished"`
	Offsets     []int64 `json:"offsets"`
	Undecodable []int64 `json:"undecodable"`
}

// Republish checks req and republishes through outboxops.RepublishRejected. Input the caller
// must fix is an error for which IsInputError is true.
func Republish(ctx context.Context, db *sql.DB, schema string, req RepublishRequest) (RepublishResponse, error) {
	if strings.TrimSpace(req.Relay) == "" {
		return RepublishResponse{}, badRequest("relay is required: the relay that rejected the rows")
	}
	if err := FirstError(CheckConsumer("relay", req.Relay), CheckText("remove_metadata", req.RemoveMetadata...)); err != nil {
		return RepublishResponse{}, badRequest("%v", err)
	}
	if (len(req.Offsets) > 0) == req.All {
		return RepublishResponse{}, badRequest("give the offsets of the rows to republish, or all (not both)")
	}
	for _, o := range req.Offsets {
		if o < 1 {
			return RepublishResponse{}, badRequest("offsets must be positive outbox offsets, got %d", o)
		}
	}
	res, err := outboxops.RepublishRejected(ctx, db, schema, outboxops.RepublishRequest{
		Relay: req.Relay, Offsets: req.Offsets, All: req.All, RemoveMetadata: req.RemoveMetadata, DryRun: req.DryRun,
	})
	if err != nil {
		return RepublishResponse{}, err
	}
	out := RepublishResponse{Relay: req.Relay, DryRun: req.DryRun, Republished: res.Republished, Offsets: res.Offsets, Undecodable: res.Undecodable}
	if out.Undecodable == nil {
		out.Undecodable = []int64{}
	}
	return out, nil
}

// ForgetRequest is the body of POST /api/outbox/forget: the retired relay whose position and
// held rows are deleted (outbox.ForgetRelay).
type ForgetRequest struct {
	Relay  string `json:"relay"`
	DryRun bool   `json:"dry_run"`
}

// ForgetResponse describes the relay forgotten (or, for a dry run, that would be): what it had
// not forwarded, which no relay of this name forwards after it is forgotten.
type ForgetResponse struct {
	Relay  string `json:"relay"`
	DryRun bool   `json:"dry_run"`
	// Backlog is the rows of its source it had not forwarded, held rows included.
	Backlog int64       `json:"backlog"`
	Held    []HeldTopic `json:"held"`
	// Stats are the relay's figures as GET /api/outbox shows them.
	Stats *RelayStats `json:"stats"`
}

// ErrRelayNotFound is returned by ForgetRelay for a relay name with no position in the schema.
//
// Its text keeps the "admin:" prefix the API's 404 and `wmonce outbox forget` have always shown.
var ErrRelayNotFound = errors.New("admin: no relay of that name has a position in this schema")

// ForgetRelay forgets a retired relay (outbox.ForgetRelay), or with DryRun says what that would
// forget. Both refuse (outbox.ErrRelayActive) while an instance of the relay leads.
func ForgetRelay(ctx context.Context, db *sql.DB, schema string, req ForgetRequest) (ForgetResponse, error) {
	if strings.TrimSpace(req.Relay) == "" {
		return ForgetResponse{}, badRequest("relay is required: the name of the retired relay")
	}
	if err := CheckConsumer("relay", req.Relay); err != nil {
		return ForgetResponse{}, badRequest("%v", err)
	}
	st, err := ReadOutbox(ctx, db, schema)
	if err != nil {
		return ForgetResponse{}, err
	}
	out := ForgetResponse{Relay: req.Relay, DryRun: req.DryRun, Held: []HeldTopic{}}
	for i := range st.Relays {
		if st.Relays[i].Name == req.Relay {
			out.Stats = &st.Relays[i]
		}
	}
	if out.Stats == nil {
		return ForgetResponse{}, fmt.Errorf("%w: %q (relays: %s)", ErrRelayNotFound, req.Relay, relayNames(st.Relays))
	}
	out.Backlog, out.Held = out.Stats.Backlog, out.Stats.Held
	active, err := outboxops.RelayActive(ctx, db, schema, req.Relay)
	if err != nil {
		return ForgetResponse{}, err
	}
	if active {
		return ForgetResponse{}, fmt.Errorf("%w (relay %q)", outbox.ErrRelayActive, req.Relay)
	}
	if req.DryRun {
		return out, nil
	}
	found, err := outbox.ForgetRelay(ctx, db, schema, req.Relay)
	if err != nil {
		return ForgetResponse{}, err
	}
	if !found { // forgotten meanwhile by someone else
		return ForgetResponse{}, fmt.Errorf("%w: %q", ErrRelayNotFound, req.Relay)
	}
	return out, nil
}

func relayNames(rs []RelayStats) string {
	if len(rs) == 0 {
		return "none"
	}
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = fmt.Sprintf("%q", r.Name)
	}
	return strings.Join(names, ", ")
}
