package pgtx

import (
	"database/sql"
	"strings"
	"sync"
	"weak"
)

// The commit guard on the wire. A pool from Open (lazy BEGIN on) can refuse a COMMIT on the
// connection itself, below pgx: between WireGuardOpen and WireGuardClose, sent inside a
// transaction, any COMMIT the client sends (tx.Commit, or COMMIT, END or PREPARE TRANSACTION as
// SQL text, alone or in a statement list) is replaced by a ROLLBACK and an error that reads as
// the attempt guard's (migrations 010 and 011), so the transaction is rolled back whole, as the
// server-side guard does, at no cost to the server: no guard row, no deferred trigger. The two
// markers are answered by the connection itself and cost no round trip. The guard ends with the
// transaction (the server reports it idle).
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

// The refusal, sent in place of a COMMIT while the guard is open: the ROLLBACK ends the
// transaction on the server, the DO block (run after it, outside any transaction) returns the
// error that the client's COMMIT then fails with. In a Parse (one statement only) the DO block
// alone: it fails the statement and aborts the transaction, so the later COMMIT rolls back.
const (
	wireRefusalRaise = `DO $wmonce$BEGIN RAISE EXCEPTION 'watermill-once: refusing to commit: a handler attempt is still running in this transaction; the transaction is rolled back and nothing of it is applied' ` +
		`USING HINT = 'a handler must not Commit or Rollback the transaction it was given (the library commits it)'; END$wmonce$`
	wireRefusal = `ROLLBACK; ` + wireRefusalRaise
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
// commits the transaction: COMMIT, END or PREPARE TRANSACTION at the start of a statement. It
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
			atStart, first = true, ""
			i++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
		case c == '-' && i+1 < len(s) && s[i+1] == '-':
			j := strings.IndexByte(s[i:], '\n')
			if j < 0 {
				return false // a comment to the end: nothing after it
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
			case atStart && (word == "commit" || word == "end"):
				return true
			case atStart && word == "prepare":
				first = word
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
	return false
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

// guardWrite returns p with every COMMIT replaced by the refusal (see endsTx), for a connection
// whose guard is open; p itself when it holds none.
func guardWrite(p []byte) []byte {
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
		return p
	}
	return append(out, rest...)
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
