// Package pgnotify keeps a connection LISTENing on a PostgreSQL channel, for loops that poll
// the database and want to be woken when there is work (the inbox processor, the outbox relay).
//
// A notification is a hint, never the only path to work: PostgreSQL delivers it only to
// sessions LISTENing when the notifying transaction commits, so callers still poll at a slow
// fallback interval, and Run calls OnListen every time LISTEN is (re)established so that work
// committed while nobody listened is looked for at once.
package pgnotify

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// ErrNotPgx is returned by Run when the *sql.DB does not use pgx's stdlib driver: only that
// driver can wait for notifications. Callers then poll only.
var ErrNotPgx = errors.New("the *sql.DB does not use pgx's stdlib driver")

// MaxChannelLength is the longest channel name PostgreSQL keeps (NAMEDATALEN-1): it truncates
// longer identifiers, which would make distinct names collide.
const MaxChannelLength = 63

// Channel returns prefix+schema, or prefix followed by a hash of schema when that is longer
// than MaxChannelLength. It is an identifier: quote it (pgtx.QuoteIdentifier) for LISTEN, or
// pass it as a parameter to pg_notify.
func Channel(prefix, schema string) string {
	c := prefix + schema
	if len(c) <= MaxChannelLength {
		return c
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(schema))
	return fmt.Sprintf("%s%016x", prefix, h.Sum64())
}

// IsPgx reports whether conn uses pgx's stdlib driver, the one Listener needs.
func IsPgx(conn *sql.Conn) bool {
	ok := false
	_ = conn.Raw(func(driverConn any) error {
		_, ok = driverConn.(*stdlib.Conn)
		return nil
	})
	return ok
}

// Listener holds one connection of DB LISTENing on Channel.
type Listener struct {
	DB      *sql.DB
	Channel string
	// OnListen is called each time LISTEN is (re)established: notifications sent while nobody
	// listened are lost, so the caller must look for work now.
	OnListen func()
	// OnNotify is called with the payload of each notification on Channel, in the listener's
	// goroutine: it must not block.
	OnNotify func(payload string)
	// OnLost is called when the connection or LISTEN failed, with the wait before the next
	// attempt (doubling from 100ms to 5s). Optional.
	OnLost func(err error, backoff time.Duration)
}

// Run listens until ctx ends, re-establishing the connection after every failure. It returns
// nil when ctx ends, or ErrNotPgx (at once) when the driver cannot wait for notifications.
func (l Listener) Run(ctx context.Context) error {
	backoff := worker.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		listened, err := l.once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrNotPgx) {
			return err
		}
		if listened {
			backoff.Reset() // a connection that worked starts the backoff over
		}
		wait := backoff.Next()
		if l.OnLost != nil {
			l.OnLost(err, wait)
		}
		if !worker.Sleep(ctx, wait) {
			return nil
		}
	}
	return nil
}

// once LISTENs on a dedicated connection and waits for notifications until it fails. listened
// reports whether LISTEN succeeded.
func (l Listener) once(ctx context.Context) (listened bool, err error) {
	conn, err := l.DB.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("LISTEN connection: %w", err)
	}
	defer conn.Close()
	if err := conn.Raw(func(driverConn any) error {
		if _, ok := driverConn.(*stdlib.Conn); !ok {
			return ErrNotPgx
		}
		return nil
	}); err != nil {
		return false, err
	}
	if _, err := conn.ExecContext(ctx, `LISTEN `+pgtx.QuoteIdentifier(l.Channel)); err != nil {
		return false, fmt.Errorf("LISTEN %s: %w", l.Channel, err)
	}
	if l.OnListen != nil {
		l.OnListen()
	}
	for {
		err := conn.Raw(func(driverConn any) error {
			// pgx buffers notifications that arrive during other queries and returns them
			// here first; this connection runs no other query.
			n, err := driverConn.(*stdlib.Conn).Conn().WaitForNotification(ctx)
			if err != nil {
				// Discard the connection: it may be left mid-read, and it is still LISTENing.
				return fmt.Errorf("%w: %w", driver.ErrBadConn, err)
			}
			if n.Channel == l.Channel && l.OnNotify != nil {
				l.OnNotify(n.Payload)
			}
			return nil
		})
		if err != nil {
			return true, fmt.Errorf("waiting for notifications on %s: %w", l.Channel, err)
		}
	}
}
