package worker

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jitter returns a wait drawn uniformly between half and all of d, so that workers that failed
// together do not retry together. It never exceeds d, so a cap on d is a cap on the wait.
// This is the module's one jitter formula.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + time.Duration(rand.Int64N(int64(d-d/2)+1))
}

// Delay returns the wait after the attempt-th consecutive failure (1-based): base, doubled for
// each further failure up to maxDelay, with Jitter. maxDelay below base counts as base.
func Delay(base, maxDelay time.Duration, attempt int) time.Duration {
	maxDelay = max(maxDelay, base)
	d := base
	for i := 1; i < attempt && d < maxDelay; i++ {
		d *= 2
	}
	return Jitter(min(d, maxDelay))
}

// Backoff counts consecutive failures and returns the wait after each: Base, doubling up to
// Max, with Jitter (see Delay). Its zero value waits nothing; it is not safe for concurrent use.
type Backoff struct {
	Base, Max time.Duration
	failures  int
}

// Next counts a failure and returns the wait before the next try.
func (b *Backoff) Next() time.Duration {
	b.failures++
	return Delay(b.Base, b.Max, b.failures)
}

// Reset forgets the failures: the next wait is Base again.
func (b *Backoff) Reset() { b.failures = 0 }

// Sleep waits for d and reports true, or reports false as soon as ctx ends.
func Sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
