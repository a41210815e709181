package pgwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
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
//   - Statements marked with DeferredPrefix, sent inside a transaction, are held back and sent
//     the same way before the next statement; their replies are synthesised at once and their
//     real replies removed (an error of theirs is passed on, as for BEGIN).
//   - GuardOpen, GuardClose and GuardCheck, sent inside a transaction, are answered
//     at once and not sent; between Open and Close a COMMIT or ROLLBACK is replaced by the
//     refusal, and every later statement of the attempt is refused (wireguard.go).
//
// Reads and writes may run in different goroutines (pgconn reads in the background during slow
// writes), so the state is behind a mutex that is never held across network I/O, and a read
// blocked on the network is interrupted when a synthesised reply becomes available.
type lazyBeginConn struct {
	net.Conn

	mu            sync.Mutex
	ready         bool      // startup finished: the first ReadyForQuery was seen
	status        byte      // transaction status of the last ReadyForQuery
	guarded       bool      // the wire guard is open: COMMITs are refused (wireguard.go)
	doomed        bool      // the guard refused: every statement is refused until undoom (wireguard.go)
	doomErrorSent bool      // doomed: the extended-protocol messages before the next Sync have their error
	pending       []string  // held-back statements (a BEGIN, or deferred ones), in order
	strip         []byte    // message types to remove from the server's stream, in order
	out           []byte    // bytes for the client: server messages kept, and synthesised replies
	outPos        int       // how much of out the client has read
	in            []byte    // server bytes not yet forming a whole message
	readErr       error     // a broken connection (never a timeout: pgconn may read on after one)
	reading       bool      // a Read is blocked on the network
	readDeadline  time.Time // the deadline pgconn asked for, restored after we wake a Read

	buf [8192]byte // network reads (one reader at a time)
}

// Wrap returns c with lazy BEGIN, deferred statements and the wire guard (see lazyBeginConn).
func Wrap(c net.Conn) net.Conn { return newLazyBeginConn(c) }

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
	written := len(p)
	if c.doomed {
		send, reply := c.doomedWrite(p)
		if len(reply) > 0 {
			c.give(reply)
		}
		c.mu.Unlock()
		if len(send) > 0 {
			if _, err := c.Conn.Write(send); err != nil {
				return 0, err
			}
		}
		return written, nil
	}
	typ, body, rest, ok := firstMessage(p)
	if ok && typ == 'Q' && len(rest) == 0 && len(body) > 0 && body[len(body)-1] == 0 {
		c.leadingMarker(string(body[:len(body)-1]))
		if reply := c.holdBack(string(body[:len(body)-1])); reply != nil {
			c.give(reply)
			c.mu.Unlock()
			return len(p), nil
		}
	}
	if c.guarded {
		p, c.doomed = guardWrite(p)
		typ, body, rest, ok = firstMessage(p)
	}
	if len(c.pending) == 0 {
		c.mu.Unlock()
		if _, err := c.Conn.Write(p); err != nil {
			return 0, err
		}
		return written, nil
	}

	var send []byte
	switch {
	case !ok:
		c.mu.Unlock()
		return 0, fmt.Errorf("pgwire: a partial message follows held-back statements: %w", errLazyBegin)
	case typ == 'Q' && len(body) > 0:
		merged := []byte(strings.Join(c.pending, ";") + ";")
		send = append(message('Q', append(merged, body...)), rest...)
		for range c.pending {
			c.strip = append(c.strip, 'C')
		}
	case typ == 'P' || typ == 'B' && namedBind(body):
		send = make([]byte, 0, len(p)+64*len(c.pending))
		for _, stmt := range c.pending {
			send = append(send, message('P', append(append([]byte{0}, stmt...), 0, 0, 0))...) // "", query, 0 param types
			send = append(send, message('B', []byte{0, 0, 0, 0, 0, 0, 0, 0})...)              // portal "", stmt "", no formats, params, results
			send = append(send, message('E', []byte{0, 0, 0, 0, 0})...)                       // portal "", no row limit
			c.strip = append(c.strip, '1', '2', 'C')
		}
		send = append(send, p...)
	case typ == 'X':
		send = p // Terminate: the server rolls back
	default:
		c.mu.Unlock()
		return 0, fmt.Errorf("pgwire: message %q cannot follow held-back statements: %w", typ, errLazyBegin)
	}
	c.pending = nil
	c.mu.Unlock()
	if _, err := c.Conn.Write(send); err != nil {
		return 0, err
	}
	return written, nil
}

// give hands reply to the client as if the server had sent it. c.mu is held.
func (c *lazyBeginConn) give(reply []byte) {
	c.out = append(c.out, reply...)
	if c.reading {
		// pgconn may be reading in the background (during a slow write): wake it up to hand
		// over the reply.
		_ = c.Conn.SetReadDeadline(time.Unix(1, 0))
	}
}

// leadingMarker opens or closes the wire guard for a query that starts with GuardOpen or
// GuardClose (after DeferredPrefix, for the close) and goes on: the marker rides with a
// statement of the library's own, in a transaction it did not begin (watermill-sql's
// subscriber's), where a pool not from Open sees only a comment. c.mu is held.
func (c *lazyBeginConn) leadingMarker(sql string) {
	switch {
	case len(sql) > len(GuardOpen) && strings.HasPrefix(sql, GuardOpen) && c.status != 'I':
		c.guarded = true
	case len(sql) > len(GuardClose) && strings.HasPrefix(sql, GuardClose),
		strings.HasPrefix(sql, DeferredPrefix+GuardClose):
		c.guarded = false
	}
}

// holdBack takes a simple query that may wait for the next statement and returns the reply to
// give the client at once, or nil if the query must be sent now. c.mu is held.
func (c *lazyBeginConn) holdBack(sql string) []byte {
	if c.status != 'I' && (sql == GuardOpen || sql == GuardClose || sql == GuardCheck) {
		if sql != GuardCheck {
			c.guarded = sql == GuardOpen
		}
		return append(message('C', []byte("SET\x00")), message('Z', []byte{c.status})...)
	}
	if c.status == 'I' && len(c.pending) == 0 && beginRE.MatchString(sql) {
		c.pending = []string{sql}
		c.status = 'T' // as far as the client knows; the server's next ReadyForQuery tells
		return synthBegin
	}
	stmts, ok := strings.CutPrefix(sql, DeferredPrefix)
	if !ok || c.status != 'T' {
		return nil
	}
	stmts = strings.TrimPrefix(stmts, GuardClose) // acted on by leadingMarker
	var reply []byte
	for stmt := range strings.SplitSeq(stmts, ";") {
		stmt = strings.TrimSpace(stmt)
		if stmt == "" {
			continue
		}
		c.pending = append(c.pending, stmt)
		tag, _, _ := strings.Cut(strings.ToUpper(stmt), " ")
		switch tag {
		case "INSERT":
			tag = "INSERT 0 0"
		case "DELETE", "UPDATE":
			tag += " 0"
		}
		reply = append(reply, message('C', append([]byte(tag), 0))...)
	}
	return append(reply, message('Z', []byte{'T'})...)
}

// DeferredPrefix marks a statement list, sent without arguments inside a transaction, that may
// travel with the transaction's next statement instead of costing a round trip of its own (with
// Open's lazy BEGIN on). The statements must not return rows (no SELECT: the connection then
// fails) nor contain ';' in literals, their outcome must not matter to the caller until then
// (the reply is given at once: RowsAffected is 0), and an error of theirs must be fine to
// surface as the error of the next statement, which then does not run (the transaction is
// aborted). Every later statement on the connection, COMMIT
// included, runs after them. Without lazy BEGIN they are simply sent at once.
const DeferredPrefix = "/* pgtx:deferred */"

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
		var ne net.Error
		switch {
		case err == nil:
		case errors.As(err, &ne) && ne.Timeout():
			if c.readDeadline.IsZero() || time.Now().Before(c.readDeadline) {
				// Not pgconn's deadline: ours, set to wake this Read (or a leftover of it).
				_ = c.Conn.SetReadDeadline(c.readDeadline)
			} else if c.outPos == len(c.out) {
				c.mu.Unlock()
				return 0, err // pgconn's own deadline; it may read on later
			}
		case c.readErr == nil:
			c.readErr = err
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
			c.readErr = fmt.Errorf("pgwire: lazy BEGIN: malformed server message: %w", errLazyBegin)
			return
		}
		if len(c.in)-pos < 1+n {
			break
		}
		m := c.in[pos : pos+1+n]
		typ := m[0]
		drop := false
		if len(c.strip) > 0 {
			switch typ {
			case c.strip[0]:
				c.strip, drop = c.strip[1:], true
			case 'E':
				c.strip = nil // BEGIN failed: what follows answers the client's statement
			case 'N', 'S', 'A':
			default:
				c.readErr = fmt.Errorf("pgwire: lazy BEGIN: unexpected server message %q: %w", typ, errLazyBegin)
				return
			}
		}
		if typ == 'Z' && n == 5 {
			c.ready, c.status = true, m[5]
			if c.status == 'I' {
				c.guarded = false // the guard ends with its transaction
			}
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
	c.readDeadline = t
	return c.Conn.SetDeadline(t)
}

func (c *lazyBeginConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline = t
	return c.Conn.SetReadDeadline(t)
}
