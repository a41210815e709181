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

// SetIdleHook makes r call f each time it starts waiting for a notification or PollInterval.
// Call it before Run.
func SetIdleHook(r *Relay, f func()) { r.idleHook = f }
