// Package pgnotify keeps one connection LISTENing on PostgreSQL channels, for loops that poll
// the database and want to be woken when there is work: the outbox relay, the inbox processor
// and the SQL broker's subscriptions. It is the one LISTEN loop of the module: the channels of
// a Listener share its connection, and a lost connection is re-established in one place, with
// backoff.
//
// A notification is a hint, never the only path to work: PostgreSQL delivers it only to
// sessions LISTENing when the notifying transaction commits, so callers still poll at a slow
// fallback interval, and Run calls OnListen every time LISTEN is (re)established so that work
// committed while nobody listened is looked for at once.
package pgnotify

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// ErrNotPgx is returned by Run when the *sql.DB does not use pgx's stdlib driver
// (github.com/jackc/pgx/v5/stdlib): only that driver can wait for notifications. Callers then
// poll only.
var ErrNotPgx = errors.New("the *sql.DB does not use pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib), which LISTEN needs")

// MaxChannelLength is the longest channel name PostgreSQL keeps (NAMEDATALEN-1): it truncates
// longer identifiers, which would make distinct names collide.
const MaxChannelLength = 63

// Reconnect backoff: the wait after a failed connection or LISTEN starts at
// ReconnectBackoff and doubles up to MaxReconnectBackoff; a connection that listened starts it
// over.
const (
	ReconnectBackoff    = 100 * time.Millisecond
	MaxReconnectBackoff = 5 * time.Second
)

// closeTimeout bounds the goodbye to the server when a connection of the Listener's own closes.
const closeTimeout = 5 * time.Second

// Channel returns prefix+schema, or prefix followed by a hash of schema when that is longer
// than MaxChannelLength. It is the one way the module names a channel. The result is an
// identifier: quote it (pgtx.QuoteIdentifier) for LISTEN, or pass it as a parameter to
// pg_notify.
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
	return conn.Raw(func(driverConn any) error {
		_, err := pgxConn(driverConn)
		return err
	}) == nil
}

func pgxConn(driverConn any) (*pgx.Conn, error) {
	c, ok := driverConn.(*stdlib.Conn)
	if !ok {
		return nil, ErrNotPgx
	}
	return c.Conn(), nil
}

// Listener holds one connection LISTENing on every channel of Channels.
type Listener struct {
	DB *sql.DB
	// Channels are the channels to LISTEN on, each with the function called with the payload
	// of each notification on it, in the listener's goroutine: it must not block.
	Channels map[string]func(payload string)
	// OwnConnection opens a connection of the listener's own, with the settings of the pool's
	// connections (tracer included), instead of holding one of DB's: it then does not count
	// against DB's SetMaxOpenConns, and is not in DB.Stats.
	OwnConnection bool
	// OnListen is called each time LISTEN is (re)established on every channel: notifications
	// sent while nobody listened are lost, so the caller must look for work now. Optional.
	OnListen func()
	// OnLost is called when the connection or LISTEN failed, with the wait before the next
	// attempt (ReconnectBackoff doubling up to MaxReconnectBackoff). Optional.
	OnLost func(err error, backoff time.Duration)
}

// Run listens until ctx ends, re-establishing the connection after every failure. It returns
// nil when ctx ends, or ErrNotPgx (at once) when the driver cannot wait for notifications.
func (l Listener) Run(ctx context.Context) error {
	backoff := worker.Backoff{Base: ReconnectBackoff, Max: MaxReconnectBackoff}
	for ctx.Err() == nil {
		listened, err := l.once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrNotPgx) {
			return err
		}
		if !worker.Sleep(ctx, l.retryWait(&backoff, listened, err)) {
			return nil
		}
	}
	return nil
}

// retryWait returns the wait before the next connection attempt after err, and reports it to
// OnLost. A connection that worked (listened) starts the backoff over.
func (l Listener) retryWait(backoff *worker.Backoff, listened bool, err error) time.Duration {
	if listened {
		backoff.Reset()
	}
	wait := backoff.Next()
	if l.OnLost != nil {
		l.OnLost(err, wait)
	}
	return wait
}

// once LISTENs on one connection and waits for notifications until it fails. listened
// reports whether LISTEN succeeded.
func (l Listener) once(ctx context.Context) (listened bool, err error) {
	err = l.withConn(ctx, func(conn *pgx.Conn) error {
		if err := l.listen(ctx, conn); err != nil {
			return err
		}
		listened = true
		return l.deliver(ctx, conn)
	})
	return listened, err
}

// listen sends LISTEN for every channel on conn and tells OnListen.
func (l Listener) listen(ctx context.Context, conn *pgx.Conn) error {
	for _, c := range slices.Sorted(maps.Keys(l.Channels)) {
		if _, err := conn.Exec(ctx, `LISTEN `+pgtx.QuoteIdentifier(c)); err != nil {
			return fmt.Errorf("LISTEN %s: %w", c, err)
		}
	}
	if l.OnListen != nil {
		l.OnListen()
	}
	return nil
}

// deliver hands each notification on conn to its channel's function until waiting fails.
func (l Listener) deliver(ctx context.Context, conn *pgx.Conn) error {
	for {
		// pgx buffers notifications that arrive during other statements and returns them here
		// first; this connection runs no other statement.
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("waiting for notifications: %w", err)
		}
		if notify := l.Channels[n.Channel]; notify != nil {
			notify(n.Payload)
		}
	}
}

// withConn runs f on the listener's connection: one of the pool's, held until f returns and
// then discarded (it may be left mid-read, and it still LISTENs), or with OwnConnection one
// opened for f and closed after it.
func (l Listener) withConn(ctx context.Context, f func(*pgx.Conn) error) error {
	pooled, err := l.DB.Conn(ctx)
	if err != nil {
		return fmt.Errorf("LISTEN connection: %w", err)
	}
	if l.OwnConnection {
		return withOwnConn(ctx, pooled, f)
	}
	defer pooled.Close()
	var ferr error
	err = pooled.Raw(func(driverConn any) error {
		conn, err := pgxConn(driverConn)
		if err != nil {
			return err
		}
		if ferr = f(conn); ferr != nil {
			return driver.ErrBadConn // the pool discards the connection
		}
		return nil
	})
	return cmp.Or(ferr, err)
}

// withOwnConn runs f on a connection of its own, opened with the configuration of pooled
// (released at once) and closed after f.
func withOwnConn(ctx context.Context, pooled *sql.Conn, f func(*pgx.Conn) error) error {
	var config *pgx.ConnConfig
	err := pooled.Raw(func(driverConn any) error {
		conn, err := pgxConn(driverConn)
		if err == nil {
			config = conn.Config() // a copy
			// The copy still points at the pool connection's notification handler.
			config.OnNotification = nil
		}
		return err
	})
	pooled.Close()
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return fmt.Errorf("LISTEN connection: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	return f(conn)
}
