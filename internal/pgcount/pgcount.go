// Package pgcount counts what a database/sql pool sends to PostgreSQL, at the wire: every
// simple query ('Q' message) and every extended-protocol Sync ('S', which ends one
// Parse/Bind/Execute round) is one query the server answers. database/sql's liveness pings
// (pgx sends "-- ping" before reusing a connection idle for over a second) and LISTEN are
// queries too. It exists so tests and the benchmark can state idle query rates they measured.
package pgcount

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// Counter counts queries sent by every connection of the pools opened with it.
type Counter struct{ n atomic.Int64 }

// Count returns the queries sent so far.
func (c *Counter) Count() int64 { return c.n.Load() }

// Open opens a pgx database/sql pool of at most maxConns connections whose queries c counts.
// tracer (optional) is set on every connection. TLS is turned off: the counter reads the
// plaintext protocol, so use it against a local server only.
func Open(ctx context.Context, databaseURL string, maxConns int, c *Counter, tracer pgx.QueryTracer) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("pgcount: %w", err)
	}
	cfg.TLSConfig = nil
	cfg.Fallbacks = nil
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: conn, c: c}, nil
	}
	if tracer != nil {
		cfg.Tracer = tracer
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("pgcount: cannot reach PostgreSQL: %w", err)
	}
	return db, nil
}

// countingConn parses the frontend messages written to the server: the first (startup) has
// no type byte, every later one is a type byte and a 4-byte length that includes itself.
type countingConn struct {
	net.Conn
	c *Counter

	mu      sync.Mutex
	started bool
	hdr     []byte
	skip    int
}

func (cc *countingConn) Write(p []byte) (int, error) {
	cc.mu.Lock()
	cc.scan(p)
	cc.mu.Unlock()
	return cc.Conn.Write(p)
}

func (cc *countingConn) scan(p []byte) {
	for len(p) > 0 {
		if cc.skip > 0 {
			n := min(cc.skip, len(p))
			cc.skip -= n
			p = p[n:]
			continue
		}
		hdrLen := 5
		if !cc.started {
			hdrLen = 4
		}
		n := min(hdrLen-len(cc.hdr), len(p))
		cc.hdr = append(cc.hdr, p[:n]...)
		p = p[n:]
		if len(cc.hdr) < hdrLen {
			return
		}
		if !cc.started {
			cc.started = true
			cc.skip = int(binary.BigEndian.Uint32(cc.hdr)) - 4
		} else {
			if t := cc.hdr[0]; t == 'Q' || t == 'S' {
				cc.c.n.Add(1)
			}
			cc.skip = int(binary.BigEndian.Uint32(cc.hdr[1:])) - 4
		}
		cc.hdr = cc.hdr[:0]
	}
}
