package pgtx

import "testing"

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
	} {
		if got := endsTx(sql); got != want {
			t.Errorf("endsTx(%q) = %v, want %v", sql, got, want)
		}
	}
}
