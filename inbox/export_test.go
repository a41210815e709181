package inbox

// ProcessorTestSignals are a Processor's test signals (see processorTestSignals).
type ProcessorTestSignals = processorTestSignals

// SettledRow is the event of ProcessorTestSignals.Settled; SettledAs says which counter the
// row went to.
type (
	SettledRow = settledRow
	SettledAs  = settledAs
)

// The values of SettledAs.
const (
	SettledDone      = settledDone
	SettledFailed    = settledFailed
	SettledParked    = settledParked
	SettledReleased  = settledReleased
	SettledLeaseLost = settledLeaseLost
)

// TestSignals returns p's test signals: Init the ones a test waits on before p runs.
func (p *Processor) TestSignals() *ProcessorTestSignals { return &p.testSignals }

// ExpiredLease is the event of ProcessorTestSignals.LeaseExpired.
type ExpiredLease = expiredLease

// ReceiverTestSignals are a Receiver's test signals (see receiverTestSignals).
type ReceiverTestSignals = receiverTestSignals

// CommittedBatch is the event of ReceiverTestSignals.BatchCommitted.
type CommittedBatch = committedBatch

// TestSignals returns r's test signals: Init the ones a test waits on before r's first Handle
// or StoreTx.
func (r *Receiver) TestSignals() *ReceiverTestSignals { return &r.testSignals }

// UpkeepSQL returns the lease upkeep's statements for schema: the reaper's ($1 consumer, $2
// attempt limit) and the renewal's ($1 ids, $2 claim tokens, $3 lease in microseconds).
func UpkeepSQL(schema string) (reap, renew string) {
	q := newQueries(schema)
	return q.reap, q.renew
}
