package once

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// GroupCommitConfig turns on group commit: when messages arrive faster than Workers transactions
// can take them (several Kafka partitions, several subscriptions, many handlers), those that find
// every transaction busy are claimed with one statement, handled one after another in ONE
// transaction and committed together, then each is acked. Commits, not handlers, are what a
// PostgreSQL consumer waits on; sharing them raises throughput when many messages are in flight.
//
// It is adaptive: a message that finds a lane (one of Workers transactions) free and nobody
// waiting runs at once, in the caller's goroutine, in a transaction of its own, exactly as without
// group commit; so with one message in flight, or up to Workers, it costs nothing. Only messages
// that arrive while every lane is busy wait, and the next lane to free up takes all of them (up to
// TxBatchSize) as one group.
//
// The guarantee is the same as per-message transactions: each message is acked only after the
// commit that holds its claim, effects and outputs. A message whose handler fails is isolated:
// the group's transaction is rolled back, the failed message is nacked alone, and the others are
// run again in a new transaction (their handlers run twice, the first run leaving no trace). A
// handler that fails with a serialization failure or deadlock is not at fault: the whole group
// runs again, up to TxRetry's attempts, as a per-message transaction would. Handlers must
// therefore be short and touch only the database; a slow handler delays every message of its
// group. Messages from watermill-sql's subscriber keep using the subscriber's
// transaction and are not grouped.
//
// Measured figures are in docs/performance.md; run
// BENCH_IN_FLIGHT=n go test -run '^$' -bench HandlerPathsInterleaved -benchtime 1x ./middleware/once/
// to compare on your machine.
type GroupCommitConfig struct {
	// Enabled turns group commit on.
	Enabled bool
	// TxBatchSize caps the messages of one transaction. Default DefaultGroupCommitTxBatchSize
	// (100), at most MaxGroupCommitTxBatchSize.
	TxBatchSize int
	// Workers is how many transactions (lanes) run at once, each holding one connection; beyond
	// that, messages are grouped. Default DefaultGroupCommitWorkers (2): fewer lanes make bigger
	// groups (fewer commits); more help when handlers are slow.
	Workers int
	// Linger makes every message wait for company before its group runs, even when a lane is
	// free. Default 0: a message runs at once when a lane is free, and a group is whatever arrived
	// while every lane was busy, so a lone message is never delayed.
	Linger time.Duration
}

// Defaults and limits of GroupCommitConfig.
const (
	DefaultGroupCommitTxBatchSize = 100
	DefaultGroupCommitWorkers     = 2
	MaxGroupCommitTxBatchSize     = 10000
)

func (c *GroupCommitConfig) setDefaults() {
	c.TxBatchSize = cmp.Or(c.TxBatchSize, DefaultGroupCommitTxBatchSize)
	c.Workers = cmp.Or(c.Workers, DefaultGroupCommitWorkers)
}

func (c GroupCommitConfig) validate() error {
	if !c.Enabled {
		return nil
	}
	if c.TxBatchSize < 1 || c.TxBatchSize > MaxGroupCommitTxBatchSize {
		return fmt.Errorf("GroupCommit.TxBatchSize must be between 1 and %d, got %d", MaxGroupCommitTxBatchSize, c.TxBatchSize)
	}
	if c.Workers < 1 {
		return fmt.Errorf("GroupCommit.Workers must be at least 1, got %d", c.Workers)
	}
	if c.Linger < 0 {
		return errors.New("GroupCommit.Linger must not be negative")
	}
	return nil
}
