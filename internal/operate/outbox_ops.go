package operate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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
	err := FirstError(
		inputIf(strings.TrimSpace(req.Relay) == "", "relay is required: the relay that rejected the rows"),
		inputErr(CheckConsumer("relay", req.Relay), CheckText("remove_metadata", req.RemoveMetadata...)),
		inputIf((len(req.Offsets) > 0) == req.All, "give the offsets of the rows to republish, or all (not both)"),
		inputIf(slices.ContainsFunc(req.Offsets, func(o int64) bool { return o < 1 }), "offsets must be positive outbox offsets, got %v", req.Offsets))
	if err != nil {
		return RepublishResponse{}, err
	}
	res, err := outboxops.RepublishRejected(ctx, db, schema, outboxops.RepublishRequest{
		Relay: req.Relay, Offsets: req.Offsets, All: req.All, RemoveMetadata: req.RemoveMetadata, DryRun: req.DryRun,
	})
	if err != nil {
		return RepublishResponse{}, err
	}
	// Undecodable is [] in JSON, never null.
	return RepublishResponse{Relay: req.Relay, DryRun: req.DryRun, Republished: res.Republished, Offsets: res.Offsets, Undecodable: append([]int64{}, res.Undecodable...)}, nil
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
	err := FirstError(
		inputIf(strings.TrimSpace(req.Relay) == "", "relay is required: the name of the retired relay"),
		inputErr(CheckConsumer("relay", req.Relay)))
	if err != nil {
		return ForgetResponse{}, err
	}
	out, err := forgetting(ctx, db, schema, req)
	if err != nil || req.DryRun {
		return out, err
	}
	found, err := outbox.ForgetRelay(ctx, db, schema, req.Relay)
	if err == nil && !found { // forgotten meanwhile by someone else
		err = fmt.Errorf("%w: %q", ErrRelayNotFound, req.Relay)
	}
	return out, err
}

// forgetting describes the relay ForgetRelay would forget, refusing a relay with no position
// (ErrRelayNotFound) or one that runs (outbox.ErrRelayActive).
func forgetting(ctx context.Context, db *sql.DB, schema string, req ForgetRequest) (ForgetResponse, error) {
	st, err := ReadOutbox(ctx, db, schema)
	if err != nil {
		return ForgetResponse{}, err
	}
	i := slices.IndexFunc(st.Relays, func(r RelayStats) bool { return r.Name == req.Relay })
	if i < 0 {
		return ForgetResponse{}, fmt.Errorf("%w: %q (relays: %s)", ErrRelayNotFound, req.Relay, relayNames(st.Relays))
	}
	active, err := outboxops.RelayActive(ctx, db, schema, req.Relay)
	if err == nil && active {
		err = fmt.Errorf("%w (relay %q)", outbox.ErrRelayActive, req.Relay)
	}
	r := &st.Relays[i]
	return ForgetResponse{Relay: req.Relay, DryRun: req.DryRun, Backlog: r.Backlog, Held: append([]HeldTopic{}, r.Held...), Stats: r}, err
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
