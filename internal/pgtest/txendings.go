package pgtest

import (
	"context"
	"database/sql"
)

// TxEnding is one way user code ends a transaction the library lent it.
type TxEnding struct {
	Name string
	End  func(tx *sql.Tx)
}

// TxEndings are the ways user code ends the transaction it was lent, for the contract that a
// handler doing so applies nothing. Errors are ignored, as repository code that commits "its"
// transaction does. The endings sent as SQL text go around database/sql, which still takes the
// transaction for open: the contract's handlers write again after ending it, and nothing of
// that may apply either (issue 34, item 2).
var TxEndings = []TxEnding{
	{"commit", func(tx *sql.Tx) { _ = tx.Commit() }},
	{"rollback", func(tx *sql.Tx) { _ = tx.Rollback() }},
	{"commit then rollback", func(tx *sql.Tx) { _ = tx.Commit(); _ = tx.Rollback() }},
	{"rollback then commit", func(tx *sql.Tx) { _ = tx.Rollback(); _ = tx.Commit() }},
	{"COMMIT as text", textEnding("COMMIT")},
	{"ROLLBACK as text", textEnding("ROLLBACK")},
	{"rollback as text, as pgx sends it", textEnding("rollback")},
	{"end as text, with a comment", textEnding("/* done */ end work ;")},
	{"COMMIT AND CHAIN as text", textEnding("commit and chain")},
	{"ABORT as text", textEnding("abort")},
}

func textEnding(query string) func(tx *sql.Tx) {
	return func(tx *sql.Tx) { _, _ = tx.ExecContext(context.Background(), query) }
}
