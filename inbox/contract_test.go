package inbox_test

import "testing"

// TestProcessorContract is what the Processor guarantees, with a per-message handler and,
// in the "batch" subtests, with the same handler run as a batch handler (asBatch): a batch of
// one per transaction, or of TxBatchSize rows where a case sets it. Each case is in the file
// of the behaviour it tests.
func TestProcessorContract(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		run  func(t *testing.T, batch bool)
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
		t.Run(c.name, func(t *testing.T) { c.run(t, false) })
		t.Run(c.name+", batch", func(t *testing.T) { c.run(t, true) })
	}
}
