package pgtx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"regexp"
	"sync"
	"time"
)

// lazyBeginConn holds back the BEGIN that pgx sends when database/sql begins a transaction and
// sends it in the same network write as the transaction's first statement, saving one round
// trip per transaction. It works on the PostgreSQL wire protocol, below pgx, so the
// transaction stays a plain *sql.Tx of pgx's stdlib driver and every pgx feature keeps working.
//
// How, exactly:
//   - A simple-protocol Query whose text is one of the BEGIN statements pgx generates, sent
//     while the connection is idle, is not sent. The conn answers it itself: CommandComplete
//     "BEGIN" and ReadyForQuery "in a transaction".
//   - The next Query is sent as one Query "<begin>;<query>": if BEGIN failed, PostgreSQL runs
//     nothing after it. The next Parse, or Bind of a named statement (extended protocol), is
//     preceded by BEGIN as unnamed Parse/Bind/Execute with no Sync of its own, so it belongs to
//     the same pipeline: an error in BEGIN makes the server skip the statement up to its Sync.
//     Either way the statement never runs outside the transaction.
//   - The replies to the held-back BEGIN are removed from what the server sends back; if BEGIN
//     failed, its ErrorResponse is passed on and becomes the error of that first statement.
//   - Anything else as the first message after a held-back BEGIN is refused with an error that
//     breaks the connection (pgx never sends one; it keeps the rule simple and safe).
//
// Reads and writes may run in different goroutines (pgconn reads in the background during slow
// writes), so the state is behind a mutex that is never held across network I/O, and a read
// blocked on the network is interrupted when a synthesised reply becomes available.
type lazyBeginConn struct {
	net.Conn

	mu           sync.Mutex
	ready        bool   // startup finished: the first ReadyForQuery was seen
	status       byte   // transaction status of the last ReadyForQuery
	pending      string // held-back BEGIN statement, "" if none
	strip        []byte // message types to remove from the server's stream, in order
	out          []byte // bytes for the client: server messages kept, and synthesised replies
	outPos       int    // how much of out the client has read
	in           []byte // server bytes not yet forming a whole message
	readErr      error
	reading      bool      // a Read is blocked on the network
	kicked       bool      // we set a past read deadline to wake that Read
	readDeadline time.Time // the deadline pgconn asked for, restored after a kick

	buf [8192]byte // network reads (one reader at a time)
}

func newLazyBeginConn(c net.Conn) *lazyBeginConn { return &lazyBeginConn{Conn: c} }

// beginRE matches the statements pgx.TxOptions renders (and nothing with a second statement).
var beginRE = regexp.MustCompile(`^begin( isolation level (serializable|repeatable read|read committed|read uncommitted))?( read write| read only)?( deferrable| not deferrable)?$`)

var synthBegin = append(message('C', []byte("BEGIN\x00")), message('Z', []byte{'T'})...)

func message(typ byte, body []byte) []byte {
	m := make([]byte, 5, 5+len(body))
	m[0] = typ
	binary.BigEndian.PutUint32(m[1:], uint32(4+len(body)))
	return append(m, body...)
}

// firstMessage splits p into its first frontend message and the rest; ok=false if p does not
// start with a whole typed message.
func firstMessage(p []byte) (typ byte, body, rest []byte, ok bool) {
	if len(p) < 5 {
		return 0, nil, nil, false
	}
	n := int(binary.BigEndian.Uint32(p[1:5]))
	if n < 4 || len(p) < 1+n {
		return 0, nil, nil, false
	}
	return p[0], p[5 : 1+n], p[1+n:], true
}

func (c *lazyBeginConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !c.ready {
		c.mu.Unlock()
		return c.Conn.Write(p)
	}
	typ, body, rest, ok := firstMessage(p)
	if c.pending == "" {
		if ok && typ == 'Q' && len(rest) == 0 && c.status == 'I' && len(body) > 0 && body[len(body)-1] == 0 &&
			beginRE.MatchString(string(body[:len(body)-1])) {
			c.pending = string(body[:len(body)-1])
			c.out = append(c.out, synthBegin...)
			if c.reading && !c.kicked {
				c.kicked = true
				_ = c.Conn.SetReadDeadline(time.Unix(1, 0))
			}
			c.mu.Unlock()
			return len(p), nil
		}
		c.mu.Unlock()
		return c.Conn.Write(p)
	}

	begin := c.pending
	var send []byte
	switch {
	case !ok:
		c.mu.Unlock()
		return 0, fmt.Errorf("pgtx: lazy BEGIN: a partial message follows a held-back BEGIN: %w", errLazyBegin)
	case typ == 'Q' && len(body) > 0:
		merged := append([]byte(begin+";"), body...)
		send = append(message('Q', merged), rest...)
		c.strip = append(c.strip, 'C')
	case typ == 'P' || typ == 'B' && namedBind(body):
		send = make([]byte, 0, len(p)+64+len(begin))
		send = append(send, message('P', append(append([]byte{0}, begin...), 0, 0, 0))...) // "", query, 0 param types
		send = append(send, message('B', []byte{0, 0, 0, 0, 0, 0, 0, 0})...)               // portal "", stmt "", no formats, params, results
		send = append(send, message('E', []byte{0, 0, 0, 0, 0})...)                        // portal "", no row limit
		send = append(send, p...)
		c.strip = append(c.strip, '1', '2', 'C')
	case typ == 'X':
		send = p // Terminate: the transaction never started
	default:
		c.mu.Unlock()
		return 0, fmt.Errorf("pgtx: lazy BEGIN: message %q cannot follow a held-back BEGIN: %w", typ, errLazyBegin)
	}
	c.pending = ""
	c.mu.Unlock()
	if _, err := c.Conn.Write(send); err != nil {
		return 0, err
	}
	return len(p), nil
}

const maxKeptBuffer = 1 << 20

var errLazyBegin = errors.New("connection broken")

// namedBind reports whether a Bind message binds a named prepared statement: binding the unnamed
// one after our unnamed Parse of BEGIN would bind BEGIN instead.
func namedBind(body []byte) bool {
	for i, b := range body { // skip the portal name
		if b == 0 {
			return i+1 < len(body) && body[i+1] != 0
		}
	}
	return false
}

func (c *lazyBeginConn) Read(p []byte) (int, error) {
	for {
		c.mu.Lock()
		if c.outPos < len(c.out) {
			n := copy(p, c.out[c.outPos:])
			c.outPos += n
			if c.outPos == len(c.out) {
				c.out, c.outPos = c.out[:0], 0
				if cap(c.out) > maxKeptBuffer {
					c.out = nil // a large result passed: do not keep its buffer for the connection's life
				}
			}
			c.mu.Unlock()
			return n, nil
		}
		if c.readErr != nil {
			err := c.readErr
			c.mu.Unlock()
			return 0, err
		}
		c.reading = true
		c.mu.Unlock()

		n, err := c.Conn.Read(c.buf[:])

		c.mu.Lock()
		c.reading = false
		if n > 0 {
			c.in = append(c.in, c.buf[:n]...)
			c.parse()
		}
		if err != nil && c.readErr == nil {
			var ne net.Error
			if c.kicked && errors.As(err, &ne) && ne.Timeout() {
				c.kicked = false
				_ = c.Conn.SetReadDeadline(c.readDeadline)
			} else {
				c.readErr = err
			}
		}
		c.mu.Unlock()
	}
}

// parse moves the whole server messages in c.in to c.out, removing the replies to a BEGIN we
// sent on the client's behalf. c.mu is held.
func (c *lazyBeginConn) parse() {
	pos := 0
	defer func() {
		c.in = c.in[:copy(c.in, c.in[pos:])] // keep the partial message, at the front
		if len(c.in) == 0 && cap(c.in) > maxKeptBuffer {
			c.in = nil
		}
	}()
	for len(c.in)-pos >= 5 {
		n := int(binary.BigEndian.Uint32(c.in[pos+1 : pos+5]))
		if n < 4 {
			c.readErr = fmt.Errorf("pgtx: lazy BEGIN: malformed server message: %w", errLazyBegin)
			return
		}
		if len(c.in)-pos < 1+n {
			break
		}
		m := c.in[pos : pos+1+n]
		typ := m[0]
		drop := false
		if len(c.strip) > 0 {
			switch {
			case typ == c.strip[0]:
				c.strip, drop = c.strip[1:], true
			case typ == 'E':
				c.strip = nil // BEGIN failed: what follows answers the client's statement
			case typ == 'N' || typ == 'S' || typ == 'A':
			default:
				c.readErr = fmt.Errorf("pgtx: lazy BEGIN: unexpected server message %q: %w", typ, errLazyBegin)
				return
			}
		}
		if typ == 'Z' && n == 5 {
			c.ready, c.status = true, m[5]
		}
		if !drop {
			c.out = append(c.out, m...)
		}
		pos += 1 + n
	}
}

func (c *lazyBeginConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline, c.kicked = t, false
	return c.Conn.SetDeadline(t)
}

func (c *lazyBeginConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline, c.kicked = t, false
	return c.Conn.SetReadDeadline(t)
}
