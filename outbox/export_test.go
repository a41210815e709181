package outbox

import "github.com/wmonce/watermill-once/internal/failgroup"

// WriterWithoutNotify returns a copy of w whose statements never notify the relay: the
// baseline of BenchmarkWriterNotify.
func WriterWithoutNotify(w *Writer) *Writer {
	c := *w
	c.insertOne, c.insertMny = insertSQL(c.table, c.config.Source != "", "")
	c.channel = ""
	return &c
}

// WriterAlwaysNotify returns a copy of w whose statements notify at every commit, idle relay
// or not: what the Writer did before it asked whether a relay waits.
func WriterAlwaysNotify(w *Writer) *Writer {
	c := *w
	c.insertOne, c.insertMny = insertSQL(c.table, c.config.Source != "", "true")
	return &c
}

// RelayTestSignals are the events of a Relay a test can wait on; RelayWait is what a relay
// that starts waiting waits for.
type (
	RelayTestSignals = relayTestSignals
	RelayWait        = relayWait
)

// RelaySignals returns r's test signals. Init the ones a test waits on before Run or
// RelayOnce: the others stay inert.
func RelaySignals(r *Relay) *RelayTestSignals { return &r.testSignals }

// WriterBefore013 returns a copy of w that stores what a Writer stored before migration 013
// (the envelope only, no notification) on a schema without the router's columns. Its
// statements take the same parameters as the Writer's and ignore the columns' ones.
func WriterBefore013(w *Writer) *Writer {
	c := *w
	ignore := ` WHERE ($4::text, $5::text, $6::text, $7::bytea) IS NULL OR true`
	c.insertOne = `INSERT INTO ` + c.table + ` (uuid, payload, metadata, transaction_id) SELECT $1, $2::json, $3::json, pg_current_xact_id()` + ignore
	c.insertMny = `INSERT INTO ` + c.table + ` (uuid, payload, metadata, transaction_id)
SELECT u, p::json, m::json, pg_current_xact_id()
FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS x(u, p, m, n)` +
		` WHERE ($4::text, $5::text[], $6::text[], $7::bytea[]) IS NULL OR true ORDER BY n`
	c.channel = ""
	return &c
}

// ReadRoundSQL is the statement with which a relay of schema reads a new round.
func ReadRoundSQL(schema string) string { return newRelayQueries(schema).readRound }

// ParkedGroupsSQL is the statement with which parkedGroups groups the newest maxRows parked
// messages of schema.
func ParkedGroupsSQL(schema string, maxRows int) string {
	q, err := failgroup.Query(schema, parkedFailures(schema), maxRows)
	if err != nil {
		panic(err)
	}
	return q
}
