package pgtx

import (
	"database/sql"
	"strings"
	"sync"
	"weak"
)

// The commit guard on the wire. A pool from Open (lazy BEGIN on) can refuse a COMMIT on the
// connection itself, below pgx: between WireGuardOpen and WireGuardClose, sent inside a
// transaction, any COMMIT the client sends (tx.Commit, or COMMIT, END, ROLLBACK, ABORT or
// PREPARE TRANSACTION as SQL text, alone or in a statement list) is replaced by a ROLLBACK and
// an error that reads as the attempt guard's (migrations 010 and 011), so the transaction is
// rolled back whole, as the server-side guard does, at no cost to the server: no guard row, no
// deferred trigger. The connection is then doomed (doomedError): nothing more of the attempt is
// sent. The two markers are answered by the connection itself and cost no round trip; they
// also act at the start of a longer statement, where the server sees a comment. The guard ends
// with the transaction (the server reports it idle).
//
// A *sql.DB opened otherwise sends the markers to the server, where they are empty statements:
// callers check WireGuards first and use the server-side guard on other pools (internal/txguard).
// WireGuardCheck changes nothing and is answered by the connection too: a statement to send
// in a transaction only to learn from database/sql whether user code ended it (sql.ErrTxDone).
const (
	WireGuardOpen  = "/* pgtx:wire-guard open */"
	WireGuardClose = "/* pgtx:wire-guard close */"
	WireGuardCheck = "/* pgtx:wire-guard check */"
)

// The refusal, sent in place of a COMMIT (or ROLLBACK) while the guard is open: the ROLLBACK
// ends the transaction on the server, the DO block (run after it, outside any transaction)
// returns the error that the client's statement then fails with. In a Parse (one statement
// only) the DO block alone: it fails the statement and aborts the transaction.
const (
	wireRefusalRaise = `DO $wmonce$BEGIN RAISE EXCEPTION 'watermill-once: refusing to commit: a handler attempt is still running in this transaction; the transaction is rolled back and nothing of it is applied' ` +
		`USING ERRCODE = '` + CodeAttemptGuard + `', HINT = 'a handler must not Commit or Rollback the transaction it was given (the library commits it)'; END$wmonce$`
	wireRefusal = `ROLLBACK; ` + wireRefusalRaise
)

// CodeAttemptGuard is the SQLSTATE of the attempt guard's refusals: a COMMIT or ROLLBACK that
// user code sent in a transaction the library lent it, and, once the guard has refused, every
// later statement of that attempt (the wire guard's doomed connection, the server guard's
// attempt_check and attempt_close of migration 017).
const CodeAttemptGuard = "WM002"

// IsAttemptGuardRefusal reports an error of the attempt guard (CodeAttemptGuard).
func IsAttemptGuardRefusal(err error) bool { return SQLState(err) == CodeAttemptGuard }

// The doomed connection. Once the guard has refused a COMMIT or ROLLBACK, the server is outside
// any transaction (or in an aborted one) while database/sql still holds the *sql.Tx open: every
// later statement of the attempt (the handler's, the outbox's, the library's guard markers) would
// run in autocommit. So the connection refuses them all itself, sending nothing, with
// doomedError, until database/sql is done with the transaction: pgx's own "rollback" is let
// through (answered at once when the server is idle, so that it logs no warning), and the
// connection is undoomed when database/sql hands it out again (Open's session reset).
var doomedError = message('E', []byte("SERROR\x00VERROR\x00C"+CodeAttemptGuard+"\x00Mwatermill-once: refused: the handler ended the transaction it was lent (COMMIT or ROLLBACK), so nothing more of this attempt reaches the database and nothing of it is applied\x00"+
	"Ha handler must not Commit or Rollback the transaction it was given (the library commits it)\x00\x00"))

// pgxRollback and pgxPing are what pgx sends for (*sql.Tx).Rollback and a pool's liveness check.
const (
	pgxRollback = "rollback"
	pgxPing     = "-- ping"
)

// wireGuardPools holds the pools from Open whose connections guard commits on the wire.
var wireGuardPools sync.Map // weak.Pointer[sql.DB] -> struct{}

func registerWireGuard(db *sql.DB) { wireGuardPools.Store(weak.Make(db), struct{}{}) }

// WireGuards reports whether db's connections refuse COMMIT between WireGuardOpen and
// WireGuardClose: db came from Open with lazy BEGIN on.
func WireGuards(db *sql.DB) bool {
	if db == nil {
		return false
	}
	_, ok := wireGuardPools.Load(weak.Make(db))
	return ok
}

// endsTx reports whether sql, a simple query (one statement or a list), holds a statement that
// ends the transaction: COMMIT, END, ABORT, ROLLBACK (not ROLLBACK TO a savepoint, nor ROLLBACK
// PREPARED) or PREPARE TRANSACTION at the start of a statement. It
// skips comments, string literals, quoted identifiers and dollar-quoted bodies; text it cannot
// read to the end (an unterminated literal or comment) counts as ending the transaction, since
// the guard must not let a COMMIT through on a misreading.
func endsTx(sql string) bool {
	s := sql
	atStart := true // at the start of a statement: the next word is its keyword
	var first string
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ';':
			if first == "rollback" {
				return true
			}
			atStart, first = true, ""
			i++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
		case c == '-' && i+1 < len(s) && s[i+1] == '-':
			j := strings.IndexByte(s[i:], '\n')
			if j < 0 {
				return first == "rollback" // a comment to the end: nothing after it
			}
			i += j + 1
		case c == '/' && i+1 < len(s) && s[i+1] == '*':
			depth, j := 1, i+2
			for j < len(s) && depth > 0 {
				switch {
				case strings.HasPrefix(s[j:], "/*"):
					depth, j = depth+1, j+2
				case strings.HasPrefix(s[j:], "*/"):
					depth, j = depth-1, j+2
				default:
					j++
				}
			}
			if depth > 0 {
				return true
			}
			i = j
		case c == '\'' || c == '"':
			escapes := c == '\'' && i > 0 && (s[i-1] == 'E' || s[i-1] == 'e') && (i < 2 || !isWordByte(s[i-2]))
			j := i + 1
			for {
				if j >= len(s) {
					return true
				}
				if escapes && s[j] == '\\' {
					j += 2
					continue
				}
				if s[j] == c {
					if j+1 < len(s) && s[j+1] == c { // doubled: part of the literal
						j += 2
						continue
					}
					break
				}
				j++
			}
			atStart = false
			i = j + 1
		case c == '$' && i+1 < len(s) && !(s[i+1] >= '0' && s[i+1] <= '9'):
			end := strings.IndexByte(s[i+1:], '$')
			tag := ""
			if end >= 0 {
				tag = s[i : i+1+end+1]
			}
			if end < 0 || !validDollarTag(tag[1:len(tag)-1]) {
				atStart = false
				i++
				continue
			}
			j := strings.Index(s[i+len(tag):], tag)
			if j < 0 {
				return true
			}
			atStart = false
			i += len(tag) + j + len(tag)
		case isWordByte(c):
			j := i
			for j < len(s) && isWordByte(s[j]) {
				j++
			}
			word := strings.ToLower(s[i:j])
			switch {
			case atStart && (word == "commit" || word == "end" || word == "abort"):
				return true
			case atStart && (word == "prepare" || word == "rollback"):
				first = word
			case first == "rollback" && (word == "work" || word == "transaction"):
			case first == "rollback" && (word == "to" || word == "prepared"):
				first = "" // a savepoint's, or a prepared transaction's: not this one
			case first == "rollback":
				return true // ROLLBACK AND [NO] CHAIN
			case first == "prepare" && word == "transaction":
				return true
			default:
				first = ""
			}
			atStart = false
			i = j
		default:
			atStart, first = false, ""
			i++
		}
	}
	return first == "rollback"
}

func isWordByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

func validDollarTag(tag string) bool {
	for i := 0; i < len(tag); i++ {
		if !isWordByte(tag[i]) || i == 0 && tag[i] >= '0' && tag[i] <= '9' {
			return false
		}
	}
	return true
}

// guardWrite returns p with every statement that ends the transaction replaced by the refusal
// (see endsTx), for a connection whose guard is open; p itself when it holds none. doomed says
// that the transaction ends: the connection refuses what follows (see doomedError). pgx's own
// "rollback" goes through (database/sql is done with the transaction: nothing follows), but
// dooms the connection too, as a handler may send the same text.
func guardWrite(p []byte) (_ []byte, doomed bool) {
	out := make([]byte, 0, len(p))
	changed := false
	rest := p
	for len(rest) > 0 {
		typ, body, next, ok := firstMessage(rest)
		if !ok {
			break // a partial message: the connection's own checks refuse it
		}
		msg := rest[:len(rest)-len(next)]
		switch {
		case typ == 'Q' && string(body) == pgxRollback+"\x00":
			doomed = true
		case typ == 'Q' && len(body) > 0 && body[len(body)-1] == 0 && endsTx(string(body[:len(body)-1])):
			msg, changed = message('Q', append([]byte(wireRefusal), 0)), true
		case typ == 'P':
			if name, query, ok := parseParse(body); ok && endsTx(query) {
				// No parameter types: the refusal takes none (a Bind that supplies some fails,
				// which refuses the COMMIT just the same).
				body := append(append(append([]byte(name), 0), wireRefusalRaise...), 0, 0, 0)
				msg, changed = message('P', body), true
			}
		}
		out = append(out, msg...)
		rest = next
	}
	if !changed {
		return p, doomed
	}
	return append(out, rest...), true
}

// doomedWrite answers what the client sends on a doomed connection (see doomedError): what to
// send to the server (pgx's rollback while the server is in a transaction, a ping, a Terminate)
// and the replies to give the client at once (the refusals). A Query is refused with an error
// and ReadyForQuery; extended-protocol messages up to a Sync with one error, as the server
// skips to the Sync after an error, and the Sync with ReadyForQuery. c.mu is held.
func (c *lazyBeginConn) doomedWrite(p []byte) (send, reply []byte) {
	if typ, body, rest, ok := firstMessage(p); ok && typ == 'Q' && len(rest) == 0 {
		switch string(body) {
		case pgxRollback + "\x00":
			if c.status != 'I' {
				return p, nil // an aborted transaction (a refused Parse): the server ends it
			}
			return nil, append(message('C', []byte("ROLLBACK\x00")), message('Z', []byte{'I'})...)
		case pgxPing + "\x00":
			return p, nil
		}
	}
	if onlyCloses(p) {
		// pgx deallocating the statements a refusal invalidated: harmless, and refusing it
		// would fail the next statement, the library's rollback included.
		return p, nil
	}
	rest := p
	for len(rest) > 0 {
		typ, _, next, ok := firstMessage(rest)
		if !ok {
			break
		}
		switch typ {
		case 'Q':
			reply = append(append(reply, doomedError...), message('Z', []byte{c.status})...)
		case 'S':
			c.doomErrorSent = false
			reply = append(reply, message('Z', []byte{c.status})...)
		case 'X':
			send = append(send, rest[:len(rest)-len(next)]...)
		default: // Parse, Bind, Describe, Execute, Close, Flush, ...
			if !c.doomErrorSent {
				c.doomErrorSent = true
				reply = append(reply, doomedError...)
			}
		}
		rest = next
	}
	return send, reply
}

// onlyCloses reports whether p holds only Close messages (of prepared statements or portals),
// Flush and Sync.
func onlyCloses(p []byte) bool {
	closes := false
	for rest := p; len(rest) > 0; {
		typ, _, next, ok := firstMessage(rest)
		switch {
		case !ok:
			return false
		case typ == 'C':
			closes = true
		case typ != 'S' && typ != 'H':
			return false
		}
		rest = next
	}
	return closes
}

// undoom ends the doomed state (see doomedError) when database/sql hands the connection out
// again: the transaction it was refused in is over.
func (c *lazyBeginConn) undoom() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.doomed, c.doomErrorSent = false, false
}

// parseParse splits a Parse message's body into the statement name and the query text.
func parseParse(body []byte) (name, query string, ok bool) {
	name, tail, ok := strings.Cut(string(body), "\x00")
	if !ok {
		return "", "", false
	}
	query, _, ok = strings.Cut(tail, "\x00")
	return name, query, ok
}
