// Package worker is the one plumbing of the background workers (outbox.Relay,
// retention.Janitor, intent.Sender, inbox.Processor, inbox.Receiver):
//
//   - Runner: the Run/Close lifecycle. Close cancels what Run is doing and waits for it to
//     return. The rules are the same for every worker: one Run at a time (a second concurrent
//     Run returns ErrRunning at once); a Run that returned because its context ended may be
//     called again; Close is final, and a Run after Close returns nil at once without working.
//   - Leader: one active instance among those sharing an advisory-lock key, by a session-level
//     lock held on a dedicated connection; the others stand by and poll.
//   - Backoff, Delay, Jitter and Sleep: the wait after a failure, doubling up to a cap, with
//     one jitter formula, always ending as soon as the context ends.
//   - LockKey: every advisory-lock key of the module, derived in one place.
//   - LeadingSignal: the test signal of a Leader taking the lead, for tests that run another
//     package's worker.
//
// It imports nothing of this module but internal/testsignal (a leaf), so that pgtx (whose
// RunInTx waits with Delay) can use it.
package worker
