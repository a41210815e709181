package once

// Counters are running totals since the middleware was created.
type Counters struct {
	// Fresh counts messages applied and committed. On watermill-sql's subscriber path it counts
	// completed attempts in the subscriber's transaction, which the subscriber commits later:
	// if that commit fails, the redelivered copy is counted again.
	Fresh uint64
	// Duplicates counts copies skipped because the key was already claimed, including, on
	// watermill-sql's subscriber path, copies whose claim met one committed after the
	// subscriber's snapshot (SQLSTATE 40001 on the claim).
	Duplicates            uint64
	FingerprintMismatches uint64 // duplicates whose payload differed from the applied one
	Failed                uint64 // attempts rolled back: handler error or panic, outbox or commit failure
	// TxRetries counts transactions re-run after a serialization failure or deadlock, and on
	// watermill-sql's subscriber path messages handed back for redelivery in a new transaction
	// after a serialization failure (see the package doc).
	TxRetries uint64
	Refused   uint64 // messages refused: an unusable key, malformed metadata, or a subscriber transaction the middleware cannot join (pgtx.ErrUnsupportedSubscriberTx)
	TooOld    uint64 // copies refused by the age guard (older than MaxMessageAge)
	// HandlerEndedTx counts deliveries whose handler called Commit or Rollback on the
	// transaction it was lent: nothing of them was applied, and each is a permanent failure
	// (wmonce.ErrHandlerEndedTx). Not counted in Failed.
	HandlerEndedTx uint64
	// HandlerAcked counts attempts whose handler called Ack or Nack on the message it was given.
	// The call is ignored (the handler gets a message of its own; the delivery is acked only
	// after the COMMIT) and logged once per consumer as a warning. Also counted in its outcome.
	HandlerAcked uint64
	// DelayedRetries counts delayed retries scheduled (StackConfig.DelayedRetries);
	// DelayedRetriesNacked the failures that could not be scheduled and were nacked instead.
	DelayedRetries, DelayedRetriesNacked uint64
}

func (c Counters) add(o Counters) Counters {
	return Counters{
		Fresh:                 c.Fresh + o.Fresh,
		Duplicates:            c.Duplicates + o.Duplicates,
		FingerprintMismatches: c.FingerprintMismatches + o.FingerprintMismatches,
		Failed:                c.Failed + o.Failed,
		TxRetries:             c.TxRetries + o.TxRetries,
		Refused:               c.Refused + o.Refused,
		TooOld:                c.TooOld + o.TooOld,
		HandlerEndedTx:        c.HandlerEndedTx + o.HandlerEndedTx,
		HandlerAcked:          c.HandlerAcked + o.HandlerAcked,
		DelayedRetries:        c.DelayedRetries + o.DelayedRetries,
		DelayedRetriesNacked:  c.DelayedRetriesNacked + o.DelayedRetriesNacked,
	}
}

// CounterKey identifies one series of Counters: a consumer and, when Config.SenderMetadataKey
// is set, the sender named in each message's metadata ("" otherwise).
type CounterKey struct {
	Consumer string
	Sender   string
}

// MiddlewareCounters is a snapshot of every count a Middleware keeps in memory since it was
// created (figures read from the database are Stats). Counts are per consumer and, with
// Config.SenderMetadataKey, per sender; Consumer and Consumers sum over senders.
type MiddlewareCounters struct {
	// Series holds one Counters per consumer and sender: what the metrics package exports.
	Series map[CounterKey]Counters
	// GroupCommitTransactions and GroupCommitMessages count the group-commit transactions that
	// committed and the messages applied in them (their ratio is the average group size).
	// Messages that found a lane free ran in a transaction of their own and are not counted.
	// Zero without GroupCommit.
	GroupCommitTransactions, GroupCommitMessages uint64
}

// Consumer returns the totals of one consumer, summed over senders.
func (c MiddlewareCounters) Consumer(consumer string) Counters {
	var sum Counters
	for k, v := range c.Series {
		if k.Consumer == consumer {
			sum = sum.add(v)
		}
	}
	return sum
}

// Consumers returns the totals of every consumer seen so far, summed over senders.
func (c MiddlewareCounters) Consumers() map[string]Counters {
	out := map[string]Counters{}
	for k, v := range c.Series {
		out[k.Consumer] = out[k.Consumer].add(v)
	}
	return out
}

// Counters returns a snapshot of the middleware's in-process counts.
func (e *Middleware) Counters() MiddlewareCounters {
	out := MiddlewareCounters{Series: map[CounterKey]Counters{}}
	e.counts.Range(func(k, v any) bool {
		out.Series[k.(CounterKey)] = v.(*counters).snapshot()
		return true
	})
	if e.group != nil {
		out.GroupCommitTransactions, out.GroupCommitMessages = e.group.groups.Load(), e.group.grouped.Load()
	}
	return out
}

func (c *counters) snapshot() Counters {
	return Counters{
		Fresh:                 c.fresh.Load(),
		Duplicates:            c.duplicates.Load(),
		FingerprintMismatches: c.mismatches.Load(),
		Failed:                c.failed.Load(),
		TxRetries:             c.txRetries.Load(),
		Refused:               c.refused.Load(),
		TooOld:                c.tooOld.Load(),
		HandlerEndedTx:        c.endedTx.Load(),
		HandlerAcked:          c.handlerAcked.Load(),
		DelayedRetries:        c.delayedRetries.Load(),
		DelayedRetriesNacked:  c.delayedRetryNacked.Load(),
	}
}
