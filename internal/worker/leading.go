package worker

import (
	"sync"

	"github.com/wmonce/watermill-once/internal/testsignal"
)

// leadingSignals holds the signals LeadingSignal handed out, by advisory-lock key.
var leadingSignals sync.Map // int64 -> *testsignal.Signal[struct{}]

// LeadingSignal returns the test signal that receives an event each time a Leader on key
// starts leading: after it took the lock and before it calls lead. It is for the tests of
// packages that run another package's worker (admin's tests run an outbox.Relay) and cannot
// reach that worker's own test signals; derive key as the worker does (LockKey).
//
// Call it before the worker runs: a leader that starts leading earlier is not seen. Calls with
// the same key return the same signal, which lives as long as the process, so a test should use
// a key of its own (a fresh schema gives one). Without a call, a Leader pays one map lookup per
// leadership taken.
func LeadingSignal(key int64) *testsignal.Signal[struct{}] {
	s := new(testsignal.Signal[struct{}])
	s.Init()
	got, _ := leadingSignals.LoadOrStore(key, s)
	return got.(*testsignal.Signal[struct{}])
}

// signalLeading sends the event of LeadingSignal(key), if a test asked for it.
func signalLeading(key int64) {
	if s, ok := leadingSignals.Load(key); ok {
		s.(*testsignal.Signal[struct{}]).Signal(struct{}{})
	}
}
