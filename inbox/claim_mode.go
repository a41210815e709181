package inbox

import "fmt"

// ClaimMode chooses how a worker holds the rows it processes.
type ClaimMode int

const (
	// ClaimLease (the default) marks claimed rows IN_PROGRESS with a claim token and a lease in a
	// statement of its own, then processes them in later transactions. Claims survive a
	// processing transaction, so a row is visible as IN_PROGRESS while it runs, and a worker
	// that dies mid-attempt still has the attempt counted (its lease expires).
	ClaimLease ClaimMode = iota
	// ClaimLock claims rows inside the processing transaction with SELECT ... FOR UPDATE SKIP
	// LOCKED: the row lock is the claim, and the row is written once, when its outcome commits
	// with the handler's effects (one row version per row instead of two, one statement per
	// transaction fewer). The lock is released by the database when the transaction ends, the
	// connection breaks or the process dies, so no lease, token or reaper is needed, and no one
	// else can change the row while it is held: a worker cut off past HandlerTimeout has its
	// transaction rolled back (database/sql rolls back a transaction whose context ends), and
	// another worker may take the row only then.
	//
	// What differs from ClaimLease: rows being processed stay PENDING (Stats counts them as
	// pending, never IN_PROGRESS), and an operator change (Ops.Replay, Ops.Skip) to a row being
	// processed waits until its transaction ends.
	//
	// Attempts count as with leases, crashes included: before the handlers run, the worker
	// commits the start of the attempt in inbox_attempts (migration 007) from a second
	// connection, since anything the locking transaction writes dies with it. The outcome
	// removes the start in the processing transaction. A start left behind is an attempt that
	// ended its connection or process (SIGKILL, an out-of-memory kill, a terminated backend):
	// the next worker to lock the row counts it, runs the row alone (not in a TxBatchSize
	// batch), and parks it as FAILED, without running it, once such an attempt was the
	// MaxAttempts-th. A start is recorded under a bound of its own, not HandlerTimeout (a start
	// the database commits after the worker gave up on it would count an attempt whose handler
	// never ran); one that fails is withdrawn, and counts only if withdrawing it fails too.
	// This costs one more statement and commit per transaction and, briefly, a second
	// connection per worker. Both modes can serve one consumer at once (during a
	// rolling change, say): each skips the rows the other holds.
	ClaimLock
)

func (m ClaimMode) String() string {
	switch m {
	case ClaimLease:
		return "lease"
	case ClaimLock:
		return "lock"
	}
	return fmt.Sprintf("ClaimMode(%d)", int(m))
}
