package once

import (
	"cmp"
	"errors"
	"time"

	"github.com/wmonce/watermill-once/internal/setup"
)

// GroupCommitConfig configures group commit, which is on by default: when messages arrive faster
// than Workers transactions can take them (several Kafka partitions, several subscriptions, many handlers), those that find
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
// runs again, up to TxRetry's attempts, as a per-message transaction would. Messages from
// watermill-sql's subscriber keep using the subscriber's transaction and are not grouped.
//
// What it asks of handlers: that they touch only the database, through the transaction, and
// are short. A handler of a grouped message runs in a goroutine of the group, may run again
// because a neighbour failed (so an effect outside the database, such as an HTTP call or an
// in-memory counter, can repeat even when its own message succeeds: without group commit it
// repeats only when the message's own transaction is retried), and delays every message of its
// group while it runs. A handler that cannot meet that sets Disabled, and every message runs in
// a transaction of its own.
//
// Measured figures are in docs/performance.md; run
// BENCH_IN_FLIGHT=n go test -run '^$' -bench HandlerPathsInterleaved -benchtime 1x ./middleware/once/
// to compare on your machine.
type GroupCommitConfig struct {
	// Disabled turns group commit off: every message runs in a transaction of its own, one
	// commit per message, as with one message in flight.
	Disabled bool
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
	if c.Disabled {
		return nil
	}
	return errors.Join(
		setup.Between("GroupCommit.TxBatchSize", c.TxBatchSize, 1, MaxGroupCommitTxBatchSize),
		setup.AtLeast("GroupCommit.Workers", c.Workers, 1),
		setup.NotNegative("GroupCommit.Linger", c.Linger),
	)
}
