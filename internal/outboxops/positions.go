package outboxops

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// A position (a row of outbox_offsets) is made of raw transaction ids (xid8) of the cluster it
// was recorded on, and transaction ids do not survive a logical move (pg_dump/pg_restore, a
// logical-replication copy): a relay would skip rows written after the move. CheckPositions
// detects that; RebasePositions recovers from it (`wmonce rebase`; docs/operations.md, Backup,
// restore and moving a database).

// ErrPositionsMoved is outbox.ErrPositionsMoved: positions of the schema were recorded on
// another cluster and must be rebased first.
var ErrPositionsMoved = errors.New("outbox: the relay positions were recorded on another cluster (a restore or a move)")

// Set by package outbox (outbox/internal_ops.go).
var (
	// CheckPositions reports, for every position of schema (relays and slot positions), whether
	// it was recorded on another cluster. It only reads. The relay runs it when it starts
	// leading and every minute, and halts while a position is moved; Prune refuses then.
	CheckPositions func(ctx context.Context, db *sql.DB, schema string) (PositionReport, error)
	// RebasePositions rebases every position of schema on this cluster, in one transaction with
	// the positions locked: every outbox row not provably forwarded by every relay of its
	// source gets this transaction's id (the relays forward it again, in insertion order), the
	// forwarded rows a frozen id, an offset sequence left behind by the move is moved on (the
	// rows it may have numbered since are republished), and every position is reset to this
	// cluster's snapshot and system identifier. Nothing unforwarded is lost; rows of a round in
	// progress may go out twice, which the consumers' claims absorb. Running relays halt while
	// positions are moved and go on within a minute. With no position moved it only records a
	// changed system identifier. Held, delayed and rejected rows keep their ids: they are
	// published by their own order, never by transaction id.
	RebasePositions func(ctx context.Context, db *sql.DB, schema string) (RebaseReport, error)
)

// PositionCheck is what CheckPositions found for one position.
type PositionCheck struct {
	Name string
	// Ahead: the position's snapshot is ahead of this cluster's transaction counter: it was
	// recorded on a cluster whose counter was higher.
	Ahead bool
	// HiddenRows counts outbox rows written after the position was recorded (offset above its
	// offset_high) whose transaction id nevertheless looks visible in it: ids of this cluster
	// below the old one's. A relay would never read them.
	HiddenRows int64
	// FutureRows counts the schema's outbox rows whose transaction id is at or above this
	// cluster's next one: they were written on another cluster (the same for every position).
	FutureRows int64
	// SequenceBehind: the outbox "offset" sequence is below the value recorded with the
	// position, so rows written from now on could take offsets the position counts as
	// forwarded: a move that did not carry the sequence over (logical replication does not).
	SequenceBehind bool
	// RecordedSystem is the system identifier the position was recorded on ("" unknown), and
	// SystemChanged whether it differs from this cluster's (false when either is unknown).
	RecordedSystem string
	SystemChanged  bool
}

// Moved reports whether the position was recorded on another cluster in a way that loses or
// hides rows: it must be rebased (RebasePositions) before the relay may go on. A changed system
// identifier alone is not: a restore into a cluster whose counter is higher loses nothing, and
// the relay records the new identifier.
func (c PositionCheck) Moved() bool {
	return c.Ahead || c.HiddenRows > 0 || c.FutureRows > 0 || c.SequenceBehind
}

// Finding describes a moved position and what to do; "" when it is not moved.
func (c PositionCheck) Finding(schema string) string {
	if !c.Moved() {
		return ""
	}
	var why []string
	for _, f := range []struct {
		found bool
		what  string
	}{
		{c.Ahead, "its snapshot is ahead of this cluster's transaction counter"},
		{c.HiddenRows > 0, fmt.Sprintf("%d rows written since look older than it", c.HiddenRows)},
		{c.FutureRows > 0, fmt.Sprintf("%d outbox rows carry transaction ids from another cluster", c.FutureRows)},
		{c.SequenceBehind, "the outbox offset sequence is behind it (not carried over)"},
		{c.SystemChanged, "recorded on cluster " + c.RecordedSystem},
	} {
		if f.found {
			why = append(why, f.what)
		}
	}
	return fmt.Sprintf("position %q was recorded on another cluster (%s): the relay forwards nothing until `wmonce -schema %s rebase` rebases it",
		c.Name, strings.Join(why, "; "), schema)
}

// PositionReport is the result of CheckPositions.
type PositionReport struct {
	Schema string
	// SystemIdentifier is this cluster's ("" when the role may not read pg_control_system).
	SystemIdentifier string
	Positions        []PositionCheck
}

// Moved returns the positions that must be rebased.
func (r PositionReport) Moved() []PositionCheck {
	var out []PositionCheck
	for _, c := range r.Positions {
		if c.Moved() {
			out = append(out, c)
		}
	}
	return out
}

// Err is nil when no position is moved, else ErrPositionsMoved with every finding.
func (r PositionReport) Err() error {
	moved := r.Moved()
	if len(moved) == 0 {
		return nil
	}
	findings := make([]string, len(moved))
	for i, c := range moved {
		findings[i] = c.Finding(r.Schema)
	}
	return fmt.Errorf("%w: %s", ErrPositionsMoved, strings.Join(findings, "; "))
}

// RebaseReport is what RebasePositions did.
type RebaseReport struct {
	Schema string
	// Positions lists the positions rebased (every position of the schema); empty when none was
	// moved and nothing was done.
	Positions []string
	// Republished counts the outbox rows given this cluster's transaction id because some relay
	// of their source had not provably forwarded them (or they were written after the move):
	// the relays forward them again, in insertion order. Rows already forwarded may be among
	// them; the consumers' claims absorb the copies.
	Republished int64
	// Frozen counts the rows every relay had forwarded whose transaction id was from another
	// cluster: given a frozen id, they count as forwarded and Prune may delete them.
	Frozen int64
	// SystemIdentifier is the identifier recorded ("" when the role may not read it), and
	// Rerecorded whether only that changed (a restore into a cluster with a higher counter:
	// nothing to rebase).
	SystemIdentifier string
	Rerecorded       bool
}
