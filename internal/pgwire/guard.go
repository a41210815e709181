package pgwire

import (
	"database/sql"
	"net"
	"slices"
	"strings"
	"sync"
	"weak"
)

// The commit guard on the wire. A pool from pgtx.Open (lazy BEGIN on) can refuse a COMMIT on the
// connection itself, below pgx: between GuardOpen and GuardClose, sent inside a
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
// callers check Guards first and use the server-side guard on other pools (internal/txguard).
// GuardCheck changes nothing and is answered by the connection too: a statement to send
// in a transaction only to learn from database/sql whether user code ended it (sql.ErrTxDone).
const (
	GuardOpen  = "/* pgtx:wire-guard open */"
	GuardClose = "/* pgtx:wire-guard close */"
	GuardCheck = "/* pgtx:wire-guard check */"
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

// The doomed connection. Once the guard has refused a COMMIT or ROLLBACK, the server is outside
// any transaction (or in an aborted one) while database/sql still holds the *sql.Tx open: every
// later statement of the attempt (the handler's, the outbox's, the library's guard markers) would
// run in autocommit. So the connection refuses them all itself, sending nothing, with
// doomedError, until database/sql is done with the transaction: pgx's own "rollback" is let
// through (answered at once when the server is idle, so that it logs no warning), and the
// connection is undoomed when database/sql hands it out again (pgtx.Open's session reset).
var doomedError = message('E', []byte("SERROR\x00VERROR\x00C"+CodeAttemptGuard+"\x00Mwatermill-once: refused: the handler ended the transaction it was lent (COMMIT or ROLLBACK), so nothing more of this attempt reaches the database and nothing of it is applied\x00"+
	"Ha handler must not Commit or Rollback the transaction it was given (the library commits it)\x00\x00"))

// pgxRollback and pgxPing are what pgx sends for (*sql.Tx).Rollback and a pool's liveness check.
const (
	pgxRollback = "rollback"
	pgxPing     = "-- ping"
)

// wireGuardPools holds the pools from pgtx.Open whose connections guard commits on the wire.
var wireGuardPools sync.Map // weak.Pointer[sql.DB] -> struct{}

// Register records that db's connections are wrapped by Wrap (pgtx.Open with lazy BEGIN on).
func Register(db *sql.DB) { wireGuardPools.Store(weak.Make(db), struct{}{}) }

// Guards reports whether db's connections refuse COMMIT between GuardOpen and
// GuardClose: db came from pgtx.Open with lazy BEGIN on.
func Guards(db *sql.DB) bool {
	if db == nil {
		return false
	}
	_, ok := wireGuardPools.Load(weak.Make(db))
	return ok
}

// endsTx reports whether sql, a simple query (one statement or a list) or a Parse's one
// statement, holds a statement that ends the transaction: COMMIT, END, ABORT, ROLLBACK (not
// ROLLBACK TO a savepoint, nor ROLLBACK PREPARED) or PREPARE TRANSACTION. Only the words a
// statement starts with count (after whitespace and comments), so the guard needs no more of
// SQL than where statements start: literals, quoted identifiers, dollar-quoted bodies and
// comments are skipped whole, since a ';' or a keyword in them starts nothing. Text it cannot
// read to the end (an unterminated literal or comment) counts as ending the transaction: the
// guard must not let a COMMIT through on a misreading.
func endsTx(sql string) bool {
	l := sqlLexer{s: sql}
	for {
		lead, more, readable := l.statement()
		if !readable || endsStatement(lead) {
			return true
		}
		if !more {
			return false
		}
	}
}

// statement reads the next statement and returns its first words (up to three, lower case,
// while nothing else came between), whether more statements follow, and false if the text
// cannot be read to the statement's end.
func (l *sqlLexer) statement() (lead []string, more, readable bool) {
	leading := true
	for {
		switch tok, text := l.next(); tok {
		case tokEnd:
			return lead, false, true
		case tokUnreadable:
			return nil, false, false
		case tokSemicolon:
			return lead, true, true
		case tokWord:
			if leading {
				lead = appendLead(lead, text)
			}
		default:
			leading = false
		}
	}
}

// appendLead adds word to a statement's first words, up to the three endsStatement reads.
func appendLead(lead []string, word string) []string {
	if len(lead) == 3 {
		return lead
	}
	return append(lead, strings.ToLower(word))
}

// endsStatement reports whether a statement starting with the words lead ends the
// transaction: its first word's rule (endingWords) decides.
func endsStatement(lead []string) bool {
	if len(lead) == 0 {
		return false
	}
	ends, ok := endingWords[lead[0]]
	return ok && ends(lead[1:])
}

// endingWords maps the first word of a statement that may end the transaction to the rule
// that decides from the words after it.
var endingWords = map[string]func(next []string) bool{
	"commit":   always,
	"end":      always,
	"abort":    always,
	"prepare":  preparesTransaction,
	"rollback": rollbackEnds,
}

func always([]string) bool { return true }

// preparesTransaction: PREPARE TRANSACTION ends it; PREPARE of a statement does not.
func preparesTransaction(next []string) bool { return len(next) > 0 && next[0] == "transaction" }

// rollbackEnds: ROLLBACK [WORK | TRANSACTION] TO a savepoint and ROLLBACK PREPARED leave this
// transaction alone; any other ROLLBACK (AND [NO] CHAIN included) ends it.
func rollbackEnds(next []string) bool {
	if len(next) > 0 && slices.Contains([]string{"work", "transaction"}, next[0]) {
		next = next[1:]
	}
	return len(next) == 0 || !slices.Contains([]string{"to", "prepared"}, next[0])
}

// The tokens of sqlLexer.
const (
	tokEnd        = iota // the end of the text
	tokWord              // a keyword or an unquoted identifier
	tokSemicolon         // the end of a statement
	tokOther             // a literal, a quoted identifier, a parameter, punctuation
	tokUnreadable        // an unterminated literal, quoted identifier or comment
)

// sqlLexer splits SQL text into the tokens endsTx needs, skipping whitespace and comments.
// It follows PostgreSQL's lexical rules as far as they decide where a token ends: a quote
// doubled inside a literal or quoted identifier, backslash escapes in E'...' strings, nested
// block comments, $tag$ dollar quotes, and '$' inside an identifier (a$b is one word, not a
// dollar quote). Backslash escapes in plain literals (standard_conforming_strings off) are not
// followed: the server must keep that setting on, its default since PostgreSQL 9.1.
type sqlLexer struct {
	s string
	i int
}

func (l *sqlLexer) next() (tok int, text string) {
	if !l.skipSpaceAndComments() {
		return tokUnreadable, ""
	}
	if l.i >= len(l.s) {
		return tokEnd, ""
	}
	c := l.s[l.i]
	switch {
	case c == ';':
		l.i++
		return tokSemicolon, ";"
	case c == '\'', c == '"':
		return l.quoted(c, false), ""
	case c == '$':
		return l.dollarQuoted(), ""
	case isWordByte(c):
		return l.word()
	}
	l.i++
	return tokOther, ""
}

// word moves past the word at l.i ('$' may follow its first byte), or the E'...' string it
// opens.
func (l *sqlLexer) word() (tok int, text string) {
	start := l.i
	for l.i++; l.i < len(l.s) && isIdentByte(l.s[l.i]); {
		l.i++
	}
	word := l.s[start:l.i]
	if strings.EqualFold(word, "e") && strings.HasPrefix(l.s[l.i:], "'") {
		return l.quoted('\'', true), ""
	}
	return tokWord, word
}

// skipSpaceAndComments moves past whitespace, -- comments and /* */ comments (nested); false
// if a /* comment does not end.
func (l *sqlLexer) skipSpaceAndComments() bool {
	for l.i < len(l.s) {
		rest := l.s[l.i:]
		switch {
		case strings.IndexByte(" \t\n\r\f\v", rest[0]) >= 0:
			l.i++
		case strings.HasPrefix(rest, "--"):
			l.i += lineLength(rest)
		case !strings.HasPrefix(rest, "/*"):
			return true
		case !l.blockComment():
			return false
		}
	}
	return true
}

// lineLength is the length of s's first line, its newline included.
func lineLength(s string) int {
	if end := strings.IndexByte(s, '\n'); end >= 0 {
		return end + 1
	}
	return len(s)
}

// blockComment moves past the /* comment at l.i, nested ones included; false if it does not
// end.
func (l *sqlLexer) blockComment() bool {
	depth := 0
	for l.i+1 < len(l.s) {
		switch l.s[l.i : l.i+2] {
		case "/*":
			depth, l.i = depth+1, l.i+2
		case "*/":
			depth, l.i = depth-1, l.i+2
			if depth == 0 {
				return true
			}
		default:
			l.i++
		}
	}
	return false
}

// quoted moves past the literal or quoted identifier opened by q at l.i (a doubled q is part
// of it; with escapes, a backslash escapes the next byte).
func (l *sqlLexer) quoted(q byte, escapes bool) int {
	for j := l.i + 1; j < len(l.s); j++ {
		switch {
		case escapes && l.s[j] == '\\':
			j++
		case l.s[j] != q:
		case strings.HasPrefix(l.s[j+1:], string(q)):
			j++ // doubled: part of the literal
		default:
			l.i = j + 1
			return tokOther
		}
	}
	return tokUnreadable
}

// dollarQuoted moves past the $tag$ ... $tag$ body at l.i, or past a '$' that opens none (a
// parameter such as $1).
func (l *sqlLexer) dollarQuoted() int {
	tag, ok := dollarTag(l.s[l.i:])
	if !ok {
		l.i++
		return tokOther
	}
	body := strings.Index(l.s[l.i+len(tag):], tag)
	if body < 0 {
		return tokUnreadable
	}
	l.i += len(tag) + body + len(tag)
	return tokOther
}

// dollarTag returns the $tag$ (or $$) that s starts with; false for a parameter ($1) or a lone $.
func dollarTag(s string) (string, bool) {
	end := 1
	for end < len(s) && isWordByte(s[end]) {
		end++
	}
	if !strings.HasPrefix(s[end:], "$") || isDigit(s[1]) {
		return "", false
	}
	return s[:end+1], true
}

// wordBytes are the ASCII bytes of words; every byte from 0x80 (UTF-8) is one too.
const wordBytes = "_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// isIdentByte reports a byte that continues an unquoted identifier: a word byte or '$'.
func isIdentByte(c byte) bool { return c == '$' || isWordByte(c) }

func isWordByte(c byte) bool { return c >= 0x80 || strings.IndexByte(wordBytes, c) >= 0 }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

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
		msg, refused := refusal(typ, body)
		if !refused {
			msg = rest[:len(rest)-len(next)]
		}
		changed = changed || refused
		doomed = doomed || isPgxRollback(typ, body)
		out = append(out, msg...)
		rest = next
	}
	if !changed {
		return p, doomed
	}
	return append(out, rest...), true
}

// isPgxRollback reports the Query that pgx sends for (*sql.Tx).Rollback.
func isPgxRollback(typ byte, body []byte) bool {
	sql, ok := queryText(typ, body)
	return ok && sql == pgxRollback
}

// refusal returns the refusal that replaces a Query or Parse message that ends the
// transaction, and false for any other message.
func refusal(typ byte, body []byte) ([]byte, bool) {
	if sql, ok := queryText(typ, body); ok && sql != pgxRollback && endsTx(sql) {
		return message('Q', append([]byte(wireRefusal), 0)), true
	}
	if name, query, ok := parseParse(typ, body); ok && endsTx(query) {
		// No parameter types: the refusal takes none (a Bind that supplies some fails, which
		// refuses the COMMIT just the same).
		return message('P', append(append(append([]byte(name), 0), wireRefusalRaise...), 0, 0, 0)), true
	}
	return nil, false
}

// doomedWrite answers what the client sends on a doomed connection (see doomedError): it gives
// the client the refusals at once and returns what still goes to the server (pgx's rollback
// while the server is in a transaction, a ping, the Close messages of pgx's cleanup, a
// Terminate). c.mu is held.
func (c *lazyBeginConn) doomedWrite(p []byte) []byte {
	if send, reply, ok := c.doomedPassThrough(p); ok {
		c.give(reply)
		return send
	}
	send, reply := c.refuseDoomed(p)
	c.give(reply)
	return send
}

// doomedPassThrough answers the writes a doomed connection lets through: pgx's rollback (sent
// while the server is in a transaction, answered at once when it is idle, so that pgx logs no
// warning), a ping, and pgx deallocating the statements a refusal invalidated (harmless;
// refusing it would fail the next statement, the library's rollback included). c.mu is held.
func (c *lazyBeginConn) doomedPassThrough(p []byte) (send, reply []byte, ok bool) {
	sql, lone := loneQuery(p)
	switch {
	case onlyCloses(p), lone && sql == pgxPing:
		return p, nil, true
	case !lone || sql != pgxRollback:
		return nil, nil, false
	case c.status != 'I':
		return p, nil, true // an aborted transaction (a refused Parse): the server ends it
	}
	return nil, append(message('C', []byte("ROLLBACK\x00")), message('Z', []byte{'I'})...), true
}

// refuseDoomed refuses every message of p: a Query with an error and ReadyForQuery,
// extended-protocol messages up to a Sync with one error (the server, too, skips to the Sync
// after an error), the Sync with ReadyForQuery. A Terminate is sent. c.mu is held.
func (c *lazyBeginConn) refuseDoomed(p []byte) (send, reply []byte) {
	for rest := p; len(rest) > 0; {
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
			reply = append(reply, c.doomOnce()...)
		}
		rest = next
	}
	return send, reply
}

// doomOnce returns doomedError for the first extended-protocol message before a Sync, nothing
// for the others. c.mu is held.
func (c *lazyBeginConn) doomOnce() []byte {
	if c.doomErrorSent {
		return nil
	}
	c.doomErrorSent = true
	return doomedError
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
		case strings.IndexByte("SH", typ) < 0: // not Sync, not Flush
			return false
		}
		rest = next
	}
	return closes
}

// ResetSession ends conn's doomed state (see doomedError) when database/sql hands the
// connection out again: the transaction it was refused in is over. Other connections are left
// alone.
func ResetSession(conn net.Conn) {
	if c, ok := conn.(*lazyBeginConn); ok {
		c.undoom()
	}
}

func (c *lazyBeginConn) undoom() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.doomed, c.doomErrorSent = false, false
}

// parseParse splits a Parse message's body into the statement name and the query text; false
// for any other message.
func parseParse(typ byte, body []byte) (name, query string, ok bool) {
	if typ != 'P' {
		return "", "", false
	}
	name, tail, ok := strings.Cut(string(body), "\x00")
	if !ok {
		return "", "", false
	}
	query, _, ok = strings.Cut(tail, "\x00")
	return name, query, ok
}
