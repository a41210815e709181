package pgwire

import (
	"cmp"
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
//     refusal, and every later statement of the attempt is refused (guard.go).
//
// Reads and writes may run in different goroutines (pgconn reads in the background during slow
// writes), so the state is behind a mutex that is never held across network I/O, and a read
// blocked on the network is interrupted when a synthesised reply becomes available.
type lazyBeginConn struct {
	net.Conn

	mu            sync.Mutex
	ready         bool      // startup finished: the first ReadyForQuery was seen
	status        byte      // transaction status of the last ReadyForQuery
	guarded       bool      // the wire guard is open: COMMITs are refused (guard.go)
	doomed        bool      // the guard refused: every statement is refused until undoom (guard.go)
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

// queryText returns the text of a simple-protocol Query message's body.
func queryText(typ byte, body []byte) (string, bool) {
	if typ != 'Q' || len(body) == 0 || body[len(body)-1] != 0 {
		return "", false
	}
	return string(body[:len(body)-1]), true
}

// Write sends what the client writes, changed as the type's doc says: what toSend decides,
// in one network write.
func (c *lazyBeginConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	send, err := c.toSend(p)
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if len(send) > 0 {
		if _, err := c.Conn.Write(send); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// toSend returns what of the client's write p goes to the server, in four steps: a doomed
// connection refuses it (guard.go), a statement that may wait is answered at once and held
// back, an open guard replaces the COMMITs in it, and the statements held back so far go
// before it. c.mu is held.
func (c *lazyBeginConn) toSend(p []byte) ([]byte, error) {
	switch {
	case !c.ready:
		return p, nil // the startup exchange is not ours to touch
	case c.doomed:
		return c.doomedWrite(p), nil
	}
	if reply := c.answerAtOnce(p); reply != nil {
		c.give(reply)
		return nil, nil
	}
	if c.guarded {
		p, c.doomed = guardWrite(p)
	}
	return c.withPending(p)
}

// answerAtOnce returns the reply to a write that is one simple Query that may wait for the next
// statement (holdBack), or nil if it must be sent; a guard marker leading a longer statement
// acts here too. c.mu is held.
func (c *lazyBeginConn) answerAtOnce(p []byte) []byte {
	sql, ok := loneQuery(p)
	if !ok {
		return nil
	}
	c.leadingMarker(sql)
	return c.holdBack(sql)
}

// loneQuery returns the text of the Query message that p is, alone.
func loneQuery(p []byte) (string, bool) {
	typ, body, rest, ok := firstMessage(p)
	sql, isQuery := queryText(typ, body)
	return sql, ok && isQuery && len(rest) == 0
}

// withPending returns p preceded by the statements held back, in the form p's first message
// needs: in the same Query text, or as a pipeline before a Parse or a named Bind. Any other
// first message breaks the connection (pgx never sends one), except a Terminate. c.mu is held.
func (c *lazyBeginConn) withPending(p []byte) ([]byte, error) {
	if len(c.pending) == 0 {
		return p, nil
	}
	typ, body, rest, ok := firstMessage(p)
	var send []byte
	switch {
	case ok && typ == 'Q' && len(body) > 0:
		send = c.pendingInQuery(body, rest)
	case typ == 'P', typ == 'B' && namedBind(body):
		send = c.pendingInPipeline(p)
	case typ == 'X':
		send = p // Terminate: the server rolls back
	default: // typ 0: a partial message
		return nil, fmt.Errorf("pgwire: message %q cannot follow held-back statements: %w", typ, errLazyBegin)
	}
	c.pending = nil
	return send, nil
}

// pendingInQuery returns the Query "<pending>;<query>" and the messages after it: if a held-back
// statement fails, PostgreSQL runs nothing after it. c.mu is held.
func (c *lazyBeginConn) pendingInQuery(body, rest []byte) []byte {
	merged := []byte(strings.Join(c.pending, ";") + ";")
	for range c.pending {
		c.strip = append(c.strip, 'C')
	}
	return append(message('Q', append(merged, body...)), rest...)
}

// pendingInPipeline returns p preceded by each held-back statement as an unnamed
// Parse/Bind/Execute without a Sync of its own: an error in one makes the server skip the
// client's statement up to its Sync. c.mu is held.
func (c *lazyBeginConn) pendingInPipeline(p []byte) []byte {
	send := make([]byte, 0, len(p)+64*len(c.pending))
	for _, stmt := range c.pending {
		send = append(send, message('P', append(append([]byte{0}, stmt...), 0, 0, 0))...) // "", query, 0 param types
		send = append(send, message('B', []byte{0, 0, 0, 0, 0, 0, 0, 0})...)              // portal "", stmt "", no formats, params, results
		send = append(send, message('E', []byte{0, 0, 0, 0, 0})...)                       // portal "", no row limit
		c.strip = append(c.strip, '1', '2', 'C')
	}
	return append(send, p...)
}

// give hands reply to the client as if the server had sent it. c.mu is held.
func (c *lazyBeginConn) give(reply []byte) {
	if len(reply) == 0 {
		return
	}
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
// subscriber's), where a pool not from pgtx.Open sees only a comment. c.mu is held.
func (c *lazyBeginConn) leadingMarker(sql string) {
	switch {
	case leads(sql, GuardOpen) && c.status != 'I':
		c.guarded = true
	case leads(sql, GuardClose), strings.HasPrefix(sql, DeferredPrefix+GuardClose):
		c.guarded = false
	}
}

// leads reports whether sql starts with marker and goes on.
func leads(sql, marker string) bool { return len(sql) > len(marker) && strings.HasPrefix(sql, marker) }

// holdBack takes a simple query that may wait for the next statement and returns the reply to
// give the client at once, or nil if the query must be sent now: a guard marker inside a
// transaction, a BEGIN while idle, deferred statements inside a transaction. c.mu is held.
func (c *lazyBeginConn) holdBack(sql string) []byte {
	switch {
	case c.status != 'I' && isGuardMarker(sql):
		return c.markerReply(sql)
	case c.beginsLazily(sql):
		c.pending = []string{sql}
		c.status = 'T' // as far as the client knows; the server's next ReadyForQuery tells
		return synthBegin
	case c.status == 'T' && strings.HasPrefix(sql, DeferredPrefix):
		return c.holdDeferred(sql)
	}
	return nil
}

// beginsLazily reports a BEGIN of pgx's sent while idle: the one BEGIN that is held back.
// c.mu is held.
func (c *lazyBeginConn) beginsLazily(sql string) bool {
	return c.status == 'I' && len(c.pending) == 0 && beginRE.MatchString(sql)
}

func isGuardMarker(sql string) bool {
	return sql == GuardOpen || sql == GuardClose || sql == GuardCheck
}

// markerReply acts on a guard marker sent alone and returns its reply. c.mu is held.
func (c *lazyBeginConn) markerReply(sql string) []byte {
	if sql != GuardCheck {
		c.guarded = sql == GuardOpen
	}
	return append(message('C', []byte("SET\x00")), message('Z', []byte{c.status})...)
}

// holdDeferred holds back the statements of a DeferredPrefix list and returns the replies
// they would get. c.mu is held.
func (c *lazyBeginConn) holdDeferred(sql string) []byte {
	stmts := strings.TrimPrefix(strings.TrimPrefix(sql, DeferredPrefix), GuardClose) // the marker: acted on by leadingMarker
	var reply []byte
	for stmt := range strings.SplitSeq(stmts, ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			c.pending = append(c.pending, stmt)
			reply = append(reply, message('C', append([]byte(commandTag(stmt)), 0))...)
		}
	}
	return append(reply, message('Z', []byte{'T'})...)
}

// commandTag is the CommandComplete tag of a statement that changed no row.
func commandTag(stmt string) string {
	tag, _, _ := strings.Cut(strings.ToUpper(stmt), " ")
	switch tag {
	case "INSERT":
		return "INSERT 0 0"
	case "DELETE", "UPDATE":
		return tag + " 0"
	}
	return tag
}

// DeferredPrefix marks a statement list, sent without arguments inside a transaction, that may
// travel with the transaction's next statement instead of costing a round trip of its own (with
// pgtx.Open's lazy BEGIN on). The statements must not return rows (no SELECT: the connection then
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

// Read hands the client what the server sent, less the replies to held-back statements, plus
// the replies synthesised for them.
func (c *lazyBeginConn) Read(p []byte) (int, error) {
	for {
		c.mu.Lock()
		if n, done, err := c.takeOut(p); done {
			c.mu.Unlock()
			return n, err
		}
		c.reading = true
		c.mu.Unlock()

		n, err := c.Conn.Read(c.buf[:])

		c.mu.Lock()
		err = c.received(n, err)
		c.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
}

// takeOut copies what is ready for the client into p, or returns the connection's error; done
// is false when there is neither and Read must wait for the server. c.mu is held.
func (c *lazyBeginConn) takeOut(p []byte) (n int, done bool, err error) {
	if c.outPos == len(c.out) {
		return 0, c.readErr != nil, c.readErr
	}
	n = copy(p, c.out[c.outPos:])
	c.outPos += n
	if c.outPos == len(c.out) {
		c.out, c.outPos = c.out[:0], 0
		if cap(c.out) > maxKeptBuffer {
			c.out = nil // a large result passed: do not keep its buffer for the connection's life
		}
	}
	return n, true, nil
}

// received takes in n bytes the server sent and the network read's error. It returns the error
// to give the client now: pgconn's own read deadline, when nothing is ready for it. A timeout
// of the deadline give set to wake the read is undone; any other error breaks the connection
// (Read returns it once what is ready was read). c.mu is held.
func (c *lazyBeginConn) received(n int, err error) error {
	c.reading = false
	if n > 0 {
		c.in = append(c.in, c.buf[:n]...)
		c.parse()
	}
	switch {
	case err == nil:
	case !isTimeout(err):
		c.readErr = cmp.Or(c.readErr, err)
	case c.ourTimeout():
		_ = c.Conn.SetReadDeadline(c.readDeadline)
	case c.outPos == len(c.out):
		return err // pgconn's own deadline; it may read on later
	}
	return nil
}

// ourTimeout reports that a read timed out on the deadline give set to wake it (or a leftover
// of it), not on pgconn's own. c.mu is held.
func (c *lazyBeginConn) ourTimeout() bool {
	return c.readDeadline.IsZero() || time.Now().Before(c.readDeadline)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// parse moves the whole server messages in c.in to c.out, removing the replies to the
// statements sent on the client's behalf. c.mu is held.
func (c *lazyBeginConn) parse() {
	pos := 0
	defer func() {
		c.in = c.in[:copy(c.in, c.in[pos:])] // keep the partial message, at the front
		if len(c.in) == 0 && cap(c.in) > maxKeptBuffer {
			c.in = nil
		}
	}()
	for {
		m, err := serverMessage(c.in[pos:])
		if err != nil || m == nil { // malformed, or not all there yet
			c.readErr = cmp.Or(err, c.readErr)
			return
		}
		keep, err := c.keep(m)
		if err != nil {
			c.readErr = err
			return
		}
		if keep {
			c.out = append(c.out, m...)
		}
		pos += len(m)
	}
}

// serverMessage returns the whole server message at the start of in; nil while it is not all
// there yet.
func serverMessage(in []byte) ([]byte, error) {
	if len(in) < 5 {
		return nil, nil
	}
	n := int(binary.BigEndian.Uint32(in[1:5]))
	switch {
	case n < 4:
		return nil, fmt.Errorf("pgwire: lazy BEGIN: malformed server message: %w", errLazyBegin)
	case len(in) < 1+n:
		return nil, nil
	}
	return in[:1+n], nil
}

// keep reports whether the server message m goes to the client: not when it is the next reply
// c.strip expects (a held-back statement's). An error (ErrorResponse) ends the stripping: a
// held-back statement failed, and what follows answers the client's statement. c.mu is held.
func (c *lazyBeginConn) keep(m []byte) (bool, error) {
	typ := m[0]
	c.noteReady(m)
	switch {
	case len(c.strip) == 0:
		return true, nil
	case typ == c.strip[0]:
		c.strip = c.strip[1:]
		return false, nil
	case typ == 'E':
		c.strip = nil
	case strings.IndexByte("NSA", typ) < 0: // notices, parameter changes, notifications pass
		return false, fmt.Errorf("pgwire: lazy BEGIN: unexpected server message %q: %w", typ, errLazyBegin)
	}
	return true, nil
}

// noteReady records the transaction status a ReadyForQuery message reports; the wire guard ends
// with its transaction. c.mu is held.
func (c *lazyBeginConn) noteReady(m []byte) {
	if m[0] != 'Z' || len(m) != 6 {
		return
	}
	c.ready, c.status = true, m[5]
	c.guarded = c.guarded && c.status != 'I'
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
