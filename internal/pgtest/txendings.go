package pgtest

import "database/sql"

// TxEnding is one way user code ends a transaction the library lent it.
type TxEnding struct {
	Name string
	End  func(tx *sql.Tx)
}

// TxEndings are the ways user code ends the transaction it was lent, for the contract that a
// handler doing so applies nothing. Errors are ignored, as repository code that commits "its"
// transaction does.
var TxEndings = []TxEnding{
	{"commit", func(tx *sql.Tx) { _ = tx.Commit() }},
	{"rollback", func(tx *sql.Tx) { _ = tx.Rollback() }},
	{"commit then rollback", func(tx *sql.Tx) { _ = tx.Commit(); _ = tx.Rollback() }},
	{"rollback then commit", func(tx *sql.Tx) { _ = tx.Rollback(); _ = tx.Commit() }},
}
