package middleware

import "sync/atomic"

// Counts are one consumer's running totals since the middleware was created.
type Counts struct {
	Fresh                 uint64 // messages applied and committed
	Duplicates            uint64 // copies skipped because the key was already claimed
	FingerprintMismatches uint64 // duplicates whose payload differed from the applied one
	Failed                uint64 // attempts rolled back: handler error or panic, outbox or commit failure
	TxRetries             uint64 // transactions re-run after a serialization failure or deadlock
	Refused               uint64 // messages refused for an unusable key
}

type counters struct {
	fresh, duplicates, mismatches, failed, txRetries, refused atomic.Uint64
}

func (e *EffectivelyOnce) countersFor(consumer string) *counters {
	if c, ok := e.counts.Load(consumer); ok {
		return c.(*counters)
	}
	c, _ := e.counts.LoadOrStore(consumer, &counters{})
	return c.(*counters)
}

// Counts returns the totals of one consumer.
func (e *EffectivelyOnce) Counts(consumer string) Counts {
	c, ok := e.counts.Load(consumer)
	if !ok {
		return Counts{}
	}
	return c.(*counters).snapshot()
}

// AllCounts returns the totals of every consumer seen so far.
func (e *EffectivelyOnce) AllCounts() map[string]Counts {
	out := map[string]Counts{}
	e.counts.Range(func(k, v any) bool {
		out[k.(string)] = v.(*counters).snapshot()
		return true
	})
	return out
}

func (c *counters) snapshot() Counts {
	return Counts{
		Fresh:                 c.fresh.Load(),
		Duplicates:            c.duplicates.Load(),
		FingerprintMismatches: c.mismatches.Load(),
		Failed:                c.failed.Load(),
		TxRetries:             c.txRetries.Load(),
		Refused:               c.refused.Load(),
	}
}
