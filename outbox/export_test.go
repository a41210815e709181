package outbox

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
