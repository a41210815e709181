package pgtx

import (
	"net"
	"sync/atomic"
)

// RoundTripCounter counts client round trips to PostgreSQL: how many times a connection
// writes after having read (or for the first time), i.e. how many times the client sends
// something and then has to wait for the server. Several statements sent in one write (a
// pipeline, a multi-statement simple query) count once. Set PoolConfig.RoundTrips to count
// every connection of a pool; it is meant for tests and diagnostics.
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
