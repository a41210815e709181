package inbox_test

import (
	"testing"

	"github.com/wmonce/watermill-once/inbox"
)

// processorModes are the two ways the Processor holds rows. The contract (processorContract) must
// hold in each; what only one mode does is tested beside it (lock_test.go, the lease tests in
// processor_test.go).
var processorModes = []struct {
	name string
	mode inbox.ClaimMode
}{
	{"lease", inbox.ClaimLease},
	{"lock", inbox.ClaimLock},
}

// TestProcessorContract runs the Processor's contract in every claim mode.
func TestProcessorContract(t *testing.T) {
	t.Parallel()
	for _, m := range processorModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			processorContract(t, m.mode)
		})
	}
}

// processorContract is what the Processor guarantees whichever way it claims rows. Each case
// is a function of the mode, in the file of the behaviour it tests.
func processorContract(t *testing.T, mode inbox.ClaimMode) {
	for _, c := range []struct {
		name string
		run  func(*testing.T, inbox.ClaimMode)
	}{
		{"a failing handler is retried with backoff, then succeeds", testFailingHandlerRetriesWithBackoffThenSucceeds},
		{"a poison row is parked while other keys go on", testPoisonRowParkedWhileOtherKeysGoOn},
		{"per-key order with four workers", testPerKeyOrderWithFourWorkers},
		{"replayed rows are processed once more", testReplayedRowsProcessedOnceMore},
		{"notifications wake idle workers", testNotifyWakesIdleWorkers},
		{"shutdown cancels handlers past the grace period", testShutdownCancelsHandlersPastGrace},
		{"outputs go to the outbox in the same transaction", testOutputsGoToOutboxInTheSameTransaction},
		{"outputs without a topic park the row", testOutputsWithoutTopicPark},
		{"rows sharing a transaction apply once each", testTxBatchModeAppliesEachRowOnce},
		{"a panic is a failed attempt", testPanicIsAFailedAttempt},
		{"Run after Close, and Run twice", testRunOnceAndCloseBeforeRun},
		{"a handler ending its transaction applies nothing and is parked", testHandlerEndingItsTransaction},
		{"a handler acking its message changes nothing", testHandlerAckingItsMessage},
		{"a handler past HandlerTimeout is not taken for one ending its transaction", testHandlerPastTimeoutIsNotTakenForEndingItsTransaction},
		{"an unstorable output parks the row at once", testUnstorableOutputParksTheRowAtOnce},
		{"the claim is exposed for downstream keys", testProcessorExposesClaimForDownstreamKeys},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t, mode) })
	}
}

// fastIn is the fast test configuration in claim mode mode.
func fastIn(mode inbox.ClaimMode, consumer string) inbox.ProcessorConfig {
	cfg := fast(consumer)
	cfg.ClaimMode = mode
	return cfg
}
