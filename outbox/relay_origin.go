package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/outboxops"
)

// originInterval is how often a leading relay checks that its position was recorded on this
// cluster (CheckPositions), besides when it starts leading; it is also how often a halted
// relay logs its finding again.
const originInterval = time.Minute

// originRecheck is how often a halted relay checks again whether its position was rebased.
const originRecheck = 5 * time.Second

// checkOrigin checks the relay's position against this cluster and reports whether it is moved
// (the relay must forward nothing: a restore or a move that RebasePositions must repair). It
// records the cluster's system identifier when only that changed (a restore into a cluster
// with a higher counter loses nothing) or when none was recorded.
func (r *Relay) checkOrigin(ctx context.Context, conn *sql.Conn) (bool, error) {
	rep, err := checkPositions(ctx, conn, r.config.Schema, r.config.Name)
	if err != nil {
		return false, fmt.Errorf("outbox: check relay position: %w", err)
	}
	if len(rep.Positions) == 0 { // not registered: register recreates it next
		return false, nil
	}
	c := rep.Positions[0]
	if c.Moved() {
		r.halt(c)
		return true, nil
	}
	if r.moved.Swap(false) {
		r.movedLogged.Store(0)
		r.logger.Info("Relay position rebased on this cluster: forwarding again", nil)
	}
	return false, r.recordSystem(ctx, conn, rep.SystemIdentifier, c)
}

// halt marks the relay as halted by a moved position, and logs it at most once per
// originInterval.
func (r *Relay) halt(c outboxops.PositionCheck) {
	r.moved.Store(true)
	if last := r.movedLogged.Load(); last == 0 || time.Since(time.Unix(0, last)) >= originInterval {
		r.movedLogged.Store(time.Now().UnixNano())
		r.logger.Error("Relay halted: its position is not of this cluster", ErrPositionsMoved,
			watermill.LogFields{"finding": c.Finding(r.config.Schema), "run": "wmonce -schema " + r.config.Schema + " rebase"})
	}
	r.testSignals.Halted.Signal(c)
}

// recordSystem records this cluster's system identifier with the position when it is known
// and the position has another or none: a restore into a cluster whose counter is higher
// needs nothing else.
func (r *Relay) recordSystem(ctx context.Context, conn *sql.Conn, system string, c outboxops.PositionCheck) error {
	if system == "" || !c.SystemChanged && c.RecordedSystem != "" {
		return nil
	}
	if _, err := conn.ExecContext(ctx, r.q.recordSystem, r.config.Name, system); err != nil {
		return fmt.Errorf("outbox: record system identifier: %w", err)
	}
	if c.SystemChanged {
		r.logger.Info("Relay position restored into another cluster whose transaction counter is higher: nothing to rebase, its system identifier recorded",
			watermill.LogFields{"recorded": c.RecordedSystem, "now": system})
	}
	return nil
}

// waitOrigin checks the position and, while it is moved, waits and checks again, forwarding
// nothing. It returns false when ctx ends first.
func (r *Relay) waitOrigin(ctx context.Context, conn *sql.Conn) (bool, error) {
	for {
		moved, err := r.checkOrigin(ctx, conn)
		if err != nil || !moved {
			return err == nil, err
		}
		t := time.NewTimer(originRecheck)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, nil
		case <-t.C:
		}
	}
}
