package pgtx

import (
	"net"
	"sync/atomic"
)

// RoundTripCounter counts client round trips to PostgreSQL (writes after a read: statements
// sent in one write count once), for every connection of a pool whose PoolConfig.RoundTrips
// it is. Meant for tests and diagnostics.
type RoundTripCounter struct{ n atomic.Int64 }

// Load returns the round trips counted so far.
func (c *RoundTripCounter) Load() int64 { return c.n.Load() }

func (c *RoundTripCounter) wrap(conn net.Conn) net.Conn { return &countingConn{Conn: conn, c: c} }

type countingConn struct {
	net.Conn
	c       *RoundTripCounter
	writing atomic.Bool // the last operation was a write
}

func (c *countingConn) Write(p []byte) (int, error) {
	if !c.writing.Swap(true) {
		c.c.n.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.writing.Store(false)
	}
	return n, err
}
