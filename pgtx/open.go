package pgtx

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/wmonce/watermill-once/internal/pgwire"
)

// DefaultDatabaseURL is used by tests, examples and the CLI when DATABASE_URL is not set.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Defaults of PoolConfig.
const (
	defaultMaxOpenConns    = 32
	defaultConnMaxLifetime = 30 * time.Minute
	defaultConnMaxIdleTime = 5 * time.Minute
	defaultPingTimeout     = 5 * time.Second
)

// PoolConfig sizes the database/sql pool. The middleware holds a connection for the whole life
// of each in-flight message, so size it for the messages processed at once plus a few.
type PoolConfig struct {
	// MaxOpenConns caps open connections. Default 32.
	MaxOpenConns int
	// MaxIdleConns keeps connections warm between bursts. Default MaxOpenConns.
	MaxIdleConns int
	// ConnMaxLifetime recycles connections. Default 30 minutes.
	ConnMaxLifetime time.Duration
	// ConnMaxIdleTime closes connections idle for this long. Default 5 minutes.
	ConnMaxIdleTime time.Duration
	// PingTimeout bounds the reachability check Open performs. Default 5 seconds.
	PingTimeout time.Duration

	// DisableLazyBegin sends BEGIN on its own (package doc). It also turns off the library's
	// deferred statements and commit guard on the wire, which need the same connection wrapper.
	DisableLazyBegin bool

	// RoundTrips, if set, counts the client round trips of every connection of the pool.
	RoundTrips *RoundTripCounter
}

func (c *PoolConfig) setDefaults() {
	c.MaxOpenConns = cmp.Or(c.MaxOpenConns, defaultMaxOpenConns)
	c.MaxIdleConns = cmp.Or(c.MaxIdleConns, c.MaxOpenConns)
	c.ConnMaxLifetime = cmp.Or(c.ConnMaxLifetime, defaultConnMaxLifetime)
	c.ConnMaxIdleTime = cmp.Or(c.ConnMaxIdleTime, defaultConnMaxIdleTime)
	c.PingTimeout = cmp.Or(c.PingTimeout, defaultPingTimeout)
}

// Validate reports a configuration that cannot work.
func (c PoolConfig) Validate() error {
	var errs []error
	if c.MaxOpenConns < 1 {
		errs = append(errs, fmt.Errorf("MaxOpenConns must be at least 1, got %d", c.MaxOpenConns))
	}
	if c.MaxIdleConns < 0 || c.MaxIdleConns > c.MaxOpenConns {
		errs = append(errs, fmt.Errorf("MaxIdleConns must be between 0 and MaxOpenConns (%d), got %d", c.MaxOpenConns, c.MaxIdleConns))
	}
	if c.ConnMaxLifetime < 0 || c.ConnMaxIdleTime < 0 || c.PingTimeout < 0 {
		errs = append(errs, errors.New("ConnMaxLifetime, ConnMaxIdleTime and PingTimeout must not be negative"))
	}
	return errors.Join(errs...)
}

// Open opens a *sql.DB on databaseURL (a postgres:// URL or a key=value DSN) through pgx's
// database/sql driver, sizes its pool and pings it: an unreachable database is an error here.
func Open(ctx context.Context, databaseURL string, pool PoolConfig) (*sql.DB, error) {
	pool.setDefaults()
	if err := pool.Validate(); err != nil {
		return nil, fmt.Errorf("pgtx: invalid pool config: %w", err)
	}
	if databaseURL == "" {
		return nil, errors.New("pgtx: empty database URL: set DATABASE_URL, e.g. " + DefaultDatabaseURL)
	}
	connConfig, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("pgtx: cannot parse database URL: %w", err)
	}
	configureConn(connConfig, pool)
	db := stdlib.OpenDB(*connConfig, stdlib.OptionResetSession(resetSession))
	db.SetMaxOpenConns(pool.MaxOpenConns)
	db.SetMaxIdleConns(pool.MaxIdleConns)
	db.SetConnMaxLifetime(pool.ConnMaxLifetime)
	db.SetConnMaxIdleTime(pool.ConnMaxIdleTime)

	pingCtx, cancel := context.WithTimeout(ctx, pool.PingTimeout)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("pgtx: cannot reach PostgreSQL at %s (is it running?): %w", redact(connConfig), err)
	}
	if !pool.DisableLazyBegin {
		pgwire.Register(db)
	}
	return db, nil
}

// configureConn wraps each connection, after TLS, in the round-trip counter and the lazy
// BEGIN, in that order (the counter sees what really goes over the network).
func configureConn(c *pgx.ConnConfig, pool PoolConfig) {
	if pool.DisableLazyBegin && pool.RoundTrips == nil {
		return
	}
	prev := c.AfterNetConnect
	c.AfterNetConnect = func(ctx context.Context, config *pgconn.Config, conn net.Conn) (net.Conn, error) {
		if prev != nil {
			var err error
			if conn, err = prev(ctx, config, conn); err != nil {
				return nil, err
			}
		}
		if pool.RoundTrips != nil {
			conn = pool.RoundTrips.wrap(conn)
		}
		if !pool.DisableLazyBegin {
			conn = pgwire.Wrap(conn)
		}
		return conn, nil
	}
}

// resetSession ends a connection's doomed state (internal/pgwire) when database/sql hands it
// out again.
func resetSession(_ context.Context, conn *pgx.Conn) error {
	pgwire.ResetSession(conn.PgConn().Conn())
	return nil
}

// redact names the server without the password, for error messages and logs.
func redact(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s:%d/%s (user %s)", c.Host, c.Port, c.Database, c.User)
}
