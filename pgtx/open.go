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

// PoolConfig sizes the database/sql pool. The effectively-once middleware holds one connection
// for the whole life of each in-flight message (claim, handler, outbox, commit), so the pool must
// be at least as large as the number of messages processed at once, plus a few for the relay and
// background work; otherwise handlers queue for connections instead of the database.
type PoolConfig struct {
	// MaxOpenConns caps open connections. Default 32.
	MaxOpenConns int
	// MaxIdleConns keeps connections warm between bursts. Default: MaxOpenConns, so a burst
	// never pays for new connections (each costs a PostgreSQL backend fork and a TLS/auth round).
	MaxIdleConns int
	// ConnMaxLifetime recycles connections so that server-side memory and prepared statements
	// do not grow forever. Default 30 minutes.
	ConnMaxLifetime time.Duration
	// ConnMaxIdleTime closes connections idle for this long. Default 5 minutes.
	ConnMaxIdleTime time.Duration
	// PingTimeout bounds the reachability check Open performs. Default 5 seconds.
	PingTimeout time.Duration

	// DisableLazyBegin sends BEGIN on its own when a transaction begins. By default it is held
	// back and sent in the same network write as the transaction's first statement, which
	// saves one round trip per transaction (see "Lazy BEGIN" in the package doc). The
	// transaction is the same; only errors of BEGIN itself surface at the first statement
	// instead of at BeginTx, and now() is taken when that statement arrives.
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

// Open parses databaseURL (a postgres:// URL or a key=value DSN), opens a *sql.DB through
// pgx's database/sql driver, sizes its pool and pings it. A database that cannot be reached is
// an error here, at construction, not at the first message.
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
	db := stdlib.OpenDB(*connConfig, stdlib.OptionResetSession(undoom))
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
		registerWireGuard(db)
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
			conn = newLazyBeginConn(conn)
		}
		return conn, nil
	}
}

// undoom ends a connection's doomed state (wireguard.go) when database/sql hands it out again.
func undoom(_ context.Context, conn *pgx.Conn) error {
	if c, ok := conn.PgConn().Conn().(*lazyBeginConn); ok {
		c.undoom()
	}
	return nil
}

// redact names the server without the password, for error messages and logs.
func redact(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s:%d/%s (user %s)", c.Host, c.Port, c.Database, c.User)
}
