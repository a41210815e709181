package outbox

// WriterWithoutNotify returns a copy of w whose statements do not notify the relay: the
// baseline of BenchmarkWriterNotify.
func WriterWithoutNotify(w *Writer) *Writer {
	c := *w
	c.insertOne, c.insertMny = insertSQL(c.table, false)
	c.channel = ""
	return &c
}

// SetIdleHook makes r call f each time it starts waiting for a notification or PollInterval.
// Call it before Run.
func SetIdleHook(r *Relay, f func()) { r.idleHook = f }
