package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/pgtx"
)

// Pause (docs/outbox-relay.md, Delayed delivery and pausing): outbox_offsets.paused_at (migration 014), set and
// cleared by PauseRelay and ResumeRelay, read by the relay with its position.

// ErrRelayNotFound is returned by PauseRelay and ResumeRelay for a name that has never run.
var ErrRelayNotFound = errors.New("outbox: no relay of that name has run in this schema")

// PauseRelay stops every instance of the relay named name from publishing, from the moment it
// commits until ResumeRelay (within one PollInterval; at once while LISTENing), and reports
// whether it was running. Rows keep being stored and wait, in order; a paused relay keeps its
// lead.
func PauseRelay(ctx context.Context, db *sql.DB, schema, name string) (bool, error) {
	return setPaused(ctx, db, schema, name, true)
}

// ResumeRelay undoes PauseRelay and reports whether the relay was paused.
func ResumeRelay(ctx context.Context, db *sql.DB, schema, name string) (bool, error) {
	return setPaused(ctx, db, schema, name, false)
}

func setPaused(ctx context.Context, db *sql.DB, schema, name string, pause bool) (bool, error) {
	op := "resume relay"
	if pause {
		op = "pause relay"
	}
	if err := checkRelayName(op, db, &schema, name); err != nil {
		return false, err
	}
	// One statement: the notification is delivered when the change commits. old reads the row
	// as the statement's snapshot has it (of two concurrent calls, both may report a change).
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	var found, was sql.NullBool
	err := db.QueryRowContext(ctx, `WITH old AS (SELECT paused_at IS NOT NULL AS paused FROM `+offsets+` WHERE consumer_group = $1),
u AS (UPDATE `+offsets+` SET paused_at = CASE WHEN $2 THEN coalesce(paused_at, now()) END WHERE consumer_group = $1 RETURNING 1)
SELECT (SELECT true FROM u), (SELECT paused FROM old), (SELECT pg_notify($3, '') FROM u) IS NULL`, name, pause, relayChannel(schema)).Scan(&found, &was, new(bool))
	if err != nil {
		if pgtx.SQLState(err) == codeUndefinedColumn {
			return false, fmt.Errorf("outbox: %s: schema %s has no pause column (migration 014): run the migrations: %w", op, schema, err)
		}
		return false, fmt.Errorf("outbox: %s: %w", op, err)
	}
	if !found.Valid {
		return false, fmt.Errorf("%w: %s: relay %q in schema %s", ErrRelayNotFound, op, name, schema)
	}
	return was.Bool != pause, nil
}

// waitPaused is the lead loop's wait while the last position read found the relay paused
// (session.paused): it waits for a notification (a resume notifies) or PollInterval, and
// reports true. It reports false, at once, for a relay that is not paused.
func (r *Relay) waitPaused(ctx context.Context, s *session, wake <-chan struct{}, poll *time.Timer) bool {
	if !s.paused {
		return false
	}
	r.testSignals.Paused.Signal(struct{}{})
	poll.Reset(r.config.PollInterval)
	select {
	case <-ctx.Done():
	case <-wake:
	case <-poll.C:
	}
	return true
}

// notePaused records what the position read said (RelayCounters.Paused) and logs a change.
func (r *Relay) notePaused(paused bool) {
	switch was := r.paused.Swap(paused); {
	case paused && !was:
		r.logger.Info("Relay paused: it publishes nothing until resumed (outbox.ResumeRelay, wmonce outbox resume)", watermill.LogFields{"poll_interval": r.config.PollInterval})
	case !paused && was:
		r.logger.Info("Relay resumed", nil)
	}
}
