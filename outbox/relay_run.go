package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/pgnotify"
)

// Close stops Run and waits for it to return. It is idempotent and final.
func (r *Relay) Close() error { return r.life.Close() }

// Run forwards rows until ctx is cancelled or Close is called, and returns nil then. Database
// and publish errors are retried with backoff; the one error it returns is ErrRelaySource. One
// Run at a time.
func (r *Relay) Run(ctx context.Context) error {
	return r.life.Run(ctx, func(ctx context.Context) error {
		// A standby never leads while the other Source's relay does: check before waiting for
		// the lock. Other errors are the leadership loop's to retry.
		if err := r.register(ctx, r.db); errors.Is(err, ErrRelaySource) {
			return err
		}
		ctx, stop := context.WithCancelCause(ctx)
		defer stop(nil)
		_ = r.leader.Run(ctx, func(ctx context.Context, conn *sql.Conn) error {
			err := r.lead(ctx, conn)
			if errors.Is(err, ErrRelaySource) {
				stop(err)
				return nil
			}
			return err
		})
		if err := context.Cause(ctx); errors.Is(err, ErrRelaySource) {
			return err
		}
		return nil
	})
}

// ErrRelaySource is returned by Run and RelayOnce when the relay's Name is registered for
// another RelayConfig.Source: give each service's relay its own Name.
var ErrRelaySource = errors.New("outbox: this relay name forwards another source")

// rowQuerier is the part of *sql.DB and *sql.Conn that register uses.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// register makes sure the relay's position exists and belongs to its Source.
func (r *Relay) register(ctx context.Context, q rowQuerier) error {
	var owner sql.NullString
	err := q.QueryRowContext(ctx, r.q.register, r.config.Name, r.config.Source).Scan(&owner)
	if err == nil && !owner.Valid { // registered concurrently: read it once it is visible
		err = q.QueryRowContext(ctx, r.q.sourceOf, r.config.Name).Scan(&owner)
	}
	if err != nil {
		return fmt.Errorf("outbox: relay init position: %w", err)
	}
	if owner.Valid && owner.String != r.config.Source {
		return fmt.Errorf("%w: relay %q in schema %s forwards source %q, and this one has Source %q: give it its own RelayConfig.Name",
			ErrRelaySource, r.config.Name, r.config.Schema, owner.String, r.config.Source)
	}
	return nil
}

// lead relays while this instance holds the leadership lock on conn (see worker.Leader): it
// runs rounds, and between them waits as the wake-up protocol (wakeup) says.
func (r *Relay) lead(ctx context.Context, conn *sql.Conn) error {
	if err := r.register(ctx, conn); err != nil {
		return err
	}
	s, err := r.newSession(ctx, conn)
	if err != nil {
		return err
	}
	defer r.heldTopics.Store(0)
	defer r.paused.Store(false)
	r.testSignals.Leading.Signal(struct{}{})
	defer r.testSignals.StoppedLeading.Signal(struct{}{})
	if !pgnotify.IsPgx(conn) {
		r.noListen.Store(true) // before the first round, which decides whether to wait after it
	}
	wake, stopListen := r.listen(ctx)
	defer stopListen()
	poll := time.NewTimer(r.config.PollInterval)
	defer poll.Stop()
	w := newWakeup(r.config.PollInterval)
	// A position recorded on another cluster (a restore) would skip rows for good: nothing is
	// forwarded until it is rebased. Checked now and every originInterval.
	var nextOrigin time.Time
	for {
		if ok, err := r.checkOriginDue(ctx, conn, &nextOrigin); err != nil || !ok {
			return err
		}
		// The round reads the position first, and with it whether the relay is paused: held
		// and delayed rows are drained after it, so that nothing is published once a pause is
		// seen.
		n, snap, err := r.round(ctx, conn, s, w.asks() && r.listenable())
		if err != nil {
			return err
		}
		if r.waitPaused(ctx, s, wake, poll) {
			continue
		}
		drained, err := r.drain(ctx, conn, s)
		if err != nil {
			return err
		}
		next := w.afterRound(drained+n, snap, r.listenable())
		if next.now {
			continue
		}
		if next.recheck {
			r.rechecks.Add(1)
		}
		// A round takes its snapshot when it starts, so a transaction that commits later is in
		// the next round: its notification is delivered after its commit and waits in wake
		// (buffered by pgx and then by the channel) until this loop takes it, and a LISTEN
		// re-established after a lost connection wakes the loop too.
		r.testSignals.Waiting.Signal(relayWait{Listening: r.listening.Load(), Recheck: next.recheck})
		poll.Reset(waitBefore(next.wait, s, nextOrigin))
		if !waitWake(ctx, wake, poll) {
			return nil
		}
	}
}

// waitWake waits for a wake-up or poll; false when ctx ends first.
func waitWake(ctx context.Context, wake <-chan struct{}, poll *time.Timer) bool {
	select {
	case <-ctx.Done():
		return false
	case <-wake:
	case <-poll.C:
	}
	return true
}

// checkOriginDue runs waitOrigin when *next has passed, and then sets the next check; false
// (with a nil error) when the relay is to stop.
func (r *Relay) checkOriginDue(ctx context.Context, conn *sql.Conn, next *time.Time) (bool, error) {
	if !time.Now().After(*next) {
		return true, nil
	}
	if ok, err := r.waitOrigin(ctx, conn); err != nil || !ok {
		return ok, err
	}
	*next = time.Now().Add(originInterval)
	return true, nil
}

// waitBefore shortens the wait the wake-up protocol gives to a held topic's next try and the
// next origin check.
func waitBefore(wait time.Duration, s *session, nextOrigin time.Time) time.Duration {
	if due, ok := s.nextDue(); ok {
		wait = max(0, min(wait, time.Until(due))) // a held topic's next try
	}
	return max(0, min(wait, time.Until(nextOrigin)))
}

// listenable reports whether a commit after a round's snapshot wakes the relay.
func (r *Relay) listenable() bool { return !r.config.DisableListen && !r.noListen.Load() }

// listen LISTENs on the schema's channel on a connection of its own until stop is called, and
// sends on wake (without blocking: one pending wake-up covers any number of commits) for
// every notification and every time LISTEN is (re)established.
func (r *Relay) listen(ctx context.Context) (wake <-chan struct{}, stop func()) {
	ch := make(chan struct{}, 1)
	signal := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	if !r.listenable() {
		return ch, func() {}
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.listening.Store(false)
		err := pgnotify.Listener{
			DB:       r.db,
			Channels: map[string]func(string){r.channel: func(string) { signal() }},
			OnListen: func() {
				r.listening.Store(true)
				signal() // rows may have committed while nobody listened
			},
			OnLost: func(err error, backoff time.Duration) {
				r.listening.Store(false)
				r.failures.Add(1)
				r.logger.Error("Relay LISTEN connection lost; polling every PollInterval until it is back", err,
					watermill.LogFields{"backoff": backoff, "poll_interval": r.config.PollInterval})
			},
		}.Run(lctx)
		if errors.Is(err, pgnotify.ErrNotPgx) {
			r.noListen.Store(true)
			r.logger.Info("LISTEN/NOTIFY unavailable, the relay polls every PollInterval", watermill.LogFields{"reason": err.Error(), "poll_interval": r.config.PollInterval})
		}
	}()
	return ch, func() { cancel(); <-done }
}

// RelayOnce tries each held topic once and forwards at most one batch, without taking
// leadership, and returns how many rows it published, held, rejected or passed over: for tests,
// the CLI and callers with their own scheduling. Beside a Run of the same Name it can publish
// rows twice (never lose them).
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: relay connection: %w", err)
	}
	defer conn.Close()
	if err := r.register(ctx, conn); err != nil {
		return 0, err
	}
	s, err := r.newSession(ctx, conn)
	if err != nil {
		return 0, err
	}
	if err := conn.QueryRowContext(ctx, r.q.paused, r.config.Name).Scan(&s.paused); err != nil {
		return 0, fmt.Errorf("outbox: read relay pause: %w", err)
	}
	if s.paused {
		return 0, nil
	}
	if moved, err := r.checkOrigin(ctx, conn); err != nil || moved {
		if moved {
			err = fmt.Errorf("%w: relay %q forwards nothing: run `wmonce -schema %s rebase`", ErrPositionsMoved, r.config.Name, r.config.Schema)
		}
		return 0, err
	}
	drained, err := r.drain(ctx, conn, s)
	if err != nil {
		return drained, err
	}
	n, _, err := r.round(ctx, conn, s, false)
	return drained + n, err
}

// drain tries the held topics whose wait is over and publishes the delayed rows that are due,
// and returns how many rows it published, rejected or moved.
func (r *Relay) drain(ctx context.Context, conn *sql.Conn, s *session) (int, error) {
	held, err := r.drainHeld(ctx, conn, s)
	if err != nil {
		return held, err
	}
	delayed, err := r.drainDelayed(ctx, conn, s)
	return held + delayed, err
}
