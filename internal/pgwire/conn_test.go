package pgwire

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// readMessages reads n whole messages from r.
func readMessages(t *testing.T, r io.Reader, n int) []byte {
	t.Helper()
	var all []byte
	for range n {
		head := make([]byte, 5)
		_, err := io.ReadFull(r, head)
		require.NoError(t, err)
		body := make([]byte, int(head[1])<<24|int(head[2])<<16|int(head[3])<<8|int(head[4])-4)
		_, err = io.ReadFull(r, body)
		require.NoError(t, err)
		all = append(append(all, head...), body...)
	}
	return all
}

// A Read already blocked on the network (pgconn's background reader during a slow write) is
// woken with the synthesised reply to a held-back BEGIN; the real replies are removed; and a
// timeout of pgconn's own deadline is reported once, not forever.
func TestLazyBeginConnWakesABlockedRead(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	c := newLazyBeginConn(client)

	go func() { _, _ = server.Write(message('Z', []byte{'I'})) }()
	require.Equal(t, message('Z', []byte{'I'}), readMessages(t, c, 1))

	got := make(chan []byte, 1)
	go func() { got <- readMessages(t, c, 2) }()        // blocks: the server sends nothing
	for blocked := false; !blocked; runtime.Gosched() { // wait until that Read is on the network
		c.mu.Lock()
		blocked = c.reading
		c.mu.Unlock()
	}
	_, err := c.Write(message('Q', []byte("begin isolation level read committed\x00")))
	require.NoError(t, err)
	select {
	case m := <-got:
		require.Equal(t, synthBegin, m)
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked Read was not woken")
	}

	sent := make(chan []byte, 1)
	go func() { sent <- readMessages(t, server, 1) }()
	_, err = c.Write(message('Q', []byte("select 1\x00")))
	require.NoError(t, err)
	require.Equal(t, message('Q', []byte("begin isolation level read committed;select 1\x00")), <-sent)
	reply := append(append(message('C', []byte("SELECT 1\x00")), message('D', []byte{0, 0})...), message('Z', []byte{'T'})...)
	go func() {
		_, _ = server.Write(message('C', []byte("BEGIN\x00")))
		_, _ = server.Write(reply)
	}()
	require.Equal(t, reply, readMessages(t, c, 3), "the reply to BEGIN is removed")

	require.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	_, err = c.Read(make([]byte, 10))
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	go func() { _, _ = server.Write(message('Z', []byte{'I'})) }()
	require.Equal(t, message('Z', []byte{'I'}), readMessages(t, c, 1), "the timeout did not break the connection")
}

// An error of the held-back BEGIN is passed on as the reply to the statement it travelled with.
func TestLazyBeginConnPassesBeginErrors(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	c := newLazyBeginConn(client)
	go func() { _, _ = server.Write(message('Z', []byte{'I'})) }()
	readMessages(t, c, 1)
	_, err := c.Write(message('Q', []byte("begin\x00")))
	require.NoError(t, err)
	readMessages(t, c, 2)
	go func() { readMessages(t, server, 4) }() // P B E (BEGIN), then the client's Parse
	_, err = c.Write(message('P', []byte("s1\x00insert\x00\x00\x00")))
	require.NoError(t, err)
	reply := append(message('E', []byte("SERROR\x00\x00")), message('Z', []byte{'I'})...)
	go func() { _, _ = server.Write(append(message('1', nil), reply...)) }()
	require.Equal(t, reply, readMessages(t, c, 2))
}
