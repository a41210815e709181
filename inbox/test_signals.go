package inbox

import (
	"time"

	"github.com/wmonce/watermill-once/internal/testsignal"
)

// processorTestSignals are the events of a Processor this package's tests wait on instead of
// polling its counters or the table (see internal/testsignal): inert unless a test initialised
// them, through export_test.go, before Run. Each comes after what it reports is counted in
// ProcessorCounters and, where it changed the table, committed.
type processorTestSignals struct {
	// Claimed comes with the row ids of each claim statement that took rows (counted in Claimed).
	Claimed testsignal.Signal[[]int64]
	// Settled comes once for each row counted in Processed, Failed, Parked, Released or
	// LeaseConflicts, saying which (settledAs).
	Settled testsignal.Signal[settledRow]
	// LeasesRenewed comes after each lease renewal statement, with the number of leases it
	// extended.
	LeasesRenewed testsignal.Signal[int]
	// LeaseExpired comes for each expired lease this processor took back (LeasesExpired); a row
	// whose last attempt it was is parked, and comes as Settled too.
	LeaseExpired testsignal.Signal[expiredLease]
	// ClaimFailed comes with the error of each failed claim (counted in Errors), before the
	// worker backs off: a database error, or a schema without the attempt guard.
	ClaimFailed testsignal.Signal[error]
	// Idle comes when a worker's claim took nothing (no row due, or the consumer paused) and
	// the worker starts waiting, with the time that claim began.
	Idle testsignal.Signal[time.Time]
}

// settledRow is the Settled event of one row.
type settledRow struct {
	ID  int64
	As  settledAs
	Err error // why the attempt failed: Failed and Parked rows (nil for one parked by the reaper)
}

// settledAs says which counter a settled row went to.
type settledAs string

const (
	settledDone      settledAs = "DONE"       // Processed: applied and committed
	settledFailed    settledAs = "failed"     // Failed, not Parked: the attempt failed; the row runs again
	settledParked    settledAs = "parked"     // Parked: the row is FAILED
	settledReleased  settledAs = "released"   // Released: given back unprocessed, attempt not counted
	settledLeaseLost settledAs = "lease lost" // LeaseConflicts: the claim was lost, nothing was changed
)

// expiredLease is the LeaseExpired event of one row.
type expiredLease struct {
	ID     int64
	Parked bool // the lost attempt was the last: the row is FAILED
}

// receiverTestSignals are the events of a Receiver this package's tests wait on (see
// processorTestSignals): inert unless a test initialised them before the receiver's first
// Handle or StoreTx (the writers read them only for rows handed to them).
type receiverTestSignals struct {
	// Queued comes when a Handle call has handed its row to the writers, with the queue's
	// length; the row is counted in Waiting by then, until answered (the queue signals under
	// its lock: a signal sent before the hand-over let a test read Waiting one short).
	Queued testsignal.Signal[int]
	// BatchTaken comes when a writer has taken a batch of waiting rows, with its size, before
	// it writes them; a lone row that a Handle call writes itself is a batch of one.
	BatchTaken testsignal.Signal[int]
	// BatchCommitted comes after each statement of Handle's rows committed (counted in
	// Batches, Stored, Duplicates and TooOld).
	BatchCommitted testsignal.Signal[committedBatch]
	// Refused comes with the permanent error of each message refused (counted in Refused).
	Refused testsignal.Signal[error]
}

// committedBatch is the BatchCommitted event of one statement.
type committedBatch struct {
	Rows       int      // rows in the statement
	Stored     int      // new PENDING rows
	Duplicates int      // rows whose key was already in the inbox
	Parked     []string // keys of the new rows the age guard stored as FAILED
}
