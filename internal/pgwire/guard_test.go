package pgwire

import (
	"strings"
	"testing"
)

// endsTx finds a COMMIT, ROLLBACK or ABORT at the start of any statement (not a rollback to a
// savepoint), and nothing in literals, identifiers, comments or function bodies; what it cannot
// read to the end counts as a COMMIT.
func TestEndsTx(t *testing.T) {
	for sql, want := range map[string]bool{
		"commit":                                      true,
		"  COMMIT AND CHAIN;":                         true,
		"end":                                         true,
		"/* x */ -- y\n commit":                       true,
		"select 1; commit":                            true,
		"PREPARE TRANSACTION 'x'":                     true,
		"prepare /* c */ transaction 'x'":             true,
		"select 'it''s; commit'":                      false,
		`select "commit"`:                             false,
		"select $$; commit$$":                         false,
		"select $f$ ; commit $f$, $1":                 false,
		"select E'\\'; commit'":                       false,
		"select 1 -- ; commit":                        false,
		"/* /* nested */ commit */ select 1":          false,
		"insert into t values ('a') returning commit": false,
		"select commitment":                           false,
		"prepare p as select 1":                       false,
		"rollback":                                    true,
		"ROLLBACK WORK":                               true,
		"rollback transaction; select 1":              true,
		"rollback -- why":                             true,
		"rollback and chain":                          true,
		"abort":                                       true,
		"Abort Transaction":                           true,
		"rollback to savepoint s":                     false,
		"ROLLBACK WORK TO s":                          false,
		"rollback prepared 'x'":                       false,
		"release savepoint s; savepoint t":            false,
		"select 'rollback'":                           false,
		"select 'unterminated":                        true,
		"/* unterminated":                             true,
		"select $x$ unterminated":                     true,
		"select a$b, 1; end":                          true,

		// Whitespace and comments before the keyword, and between statements.
		"\t\r\n\f\vcommit":                     true, // \v: a syntax error to PostgreSQL 15, whitespace to newer lexers
		"-- a line\n-- another\ncommit":        true,
		"/* a */ /* b */ end":                  true,
		"select 1 /* ; */; /* x */ rollback":   true,
		"select 1;;; commit":                   true,
		";":                                    false,
		"":                                     false,
		"-- only a comment":                    false,
		"/* only */ /* comments */":            false,
		"select 1 -- trailing\n; commit":       true,
		"select 1; -- commit":                  false,
		"commit/* tight */":                    true,
		"rollback/* c */to s":                  false,
		"rollback work/* c */and chain":        true,
		"select 1;commit;select 2":             true,
		"savepoint s; rollback to s; select 1": false,

		// Quotes: literals, quoted identifiers, escape strings.
		`select "a""; commit"`:         false,
		`select "unterminated; commit`: true,
		"select e'\\\\'; commit":       true, // E'\\' is one backslash: the literal ends there
		"select 'a\\'; commit":         true, // a plain literal: the backslash is a character
		"select x'; commit'":           false,
		"select e'it\\'s'; select 1":   false,
		"select me'x'; commit":         true, // me is a word, 'x' a plain literal
		"select 'a' 'b'; select 'c'":   false,
		"select U&'d\\0061t\\+000061'": false,

		// Dollar quotes, parameters and '$' in identifiers.
		"do $body$ begin commit; end $body$":     false,
		"do $body$ $other$ commit $body$; abort": true,
		"select $1; commit":                      true,
		"select $1$x$1$; commit":                 true, // $1 is a parameter, not a tag
		"select $a$ x $a$$b$; commit $b$":        false,
		"select a$$; commit$$":                   false, // commit$$ is a word
		"select $_x$;$_x$":                       false,
		"select $$":                              true,
		"select $":                               false,
		"end$$":                                  false,

		// What only looks like a transaction's end.
		"commitx":                   false,
		"ending":                    false,
		"prepare":                   false,
		"prepare foo":               false,
		"select 1 end":              false,
		"(commit)":                  false,
		"create table end_ (x int)": false,
		"abort_it":                  false,
		"rollback prepared":         false,
		"rollbackx":                 false,
	} {
		if got := endsTx(sql); got != want {
			t.Errorf("endsTx(%q) = %v, want %v", sql, got, want)
		}
	}
}

// FuzzEndsTx checks what must hold for any text: a COMMIT after text read to the end is found
// (the guard must not lose a statement boundary), and text quoted as a literal, a quoted
// identifier or a dollar-quoted body never ends anything.
func FuzzEndsTx(f *testing.F) {
	for _, seed := range []string{"select 1", "commit", "'", `"`, "$$", "$a$", "/*", "--", "e'\\'", "a$b", "/* /* */", "rollback to s"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.IndexByte(s, 0) >= 0 {
			return // a protocol message cannot carry it
		}
		if !endsTx(s) && !endsTx(s+"\n;commit") {
			t.Errorf("endsTx(%q + \"\\n;commit\") = false after reading %q to the end", s, s)
		}
		if quoted := "select '" + strings.ReplaceAll(s, "'", "''") + "'"; endsTx(quoted) {
			t.Errorf("endsTx(%q) = true for a literal", quoted)
		}
		if quoted := `select "` + strings.ReplaceAll(s, `"`, `""`) + `"`; endsTx(quoted) {
			t.Errorf("endsTx(%q) = true for a quoted identifier", quoted)
		}
		if !strings.Contains(s+"$", "$q$") {
			if quoted := "do $q$" + s + "$q$"; endsTx(quoted) {
				t.Errorf("endsTx(%q) = true for a dollar-quoted body", quoted)
			}
		}
	})
}
