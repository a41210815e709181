package admin

import (
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/wmonce/watermill-once/internal/operate"
)

// What the charts show, and where each series comes from:
//
//   - claims: rows in processed_messages and processed_messages_daily by processed_at, counted
//     by the database for the whole window (internal/claims.ClaimHistory). Real history, from every
//     process, as long as retention keeps the rows.
//   - duplicates: a duplicate leaves no claim row, so every process's middleware adds its
//     duplicates per consumer and minute to duplicates_per_minute (internal/claims.DuplicateHistory).
//     Real history from every process too, kept two days.
//   - inbox pending, failed, oldest pending age and relay backlog and lag: the database holds
//     only their present value (outbox.Stats, inbox.Ops.AllStats), so the handler samples
//     them; a bucket holds the largest sampled value. This process only, since sampling began:
//     for their history across restarts, scrape ops/metrics (ops/deploy/grafana charts them).

// Windows the charts cover: the last hour in one-minute buckets, the last day in 15-minute
// buckets.
var windows = map[string]struct{ span, bucket time.Duration }{
	"hour": {time.Hour, time.Minute},
	"day":  {24 * time.Hour, 15 * time.Minute},
}

// coarsePeriod is the resolution of the day's samples: each entry summarises the samples of up
// to this long (largest gauge values), so a day costs 288 entries.
const coarsePeriod = 5 * time.Minute

// maxFine bounds the hour's samples (one a second) however often Sample is called.
const maxFine = 3600

type inboxSample struct {
	pending, failed int64
	oldestAge       float64
}

type relaySample struct {
	backlog int64
	lag     float64
}

// sample is what the handler saw at one time. A nil map means that part could not be read.
type sample struct {
	at     time.Time
	start  time.Time // the first sample merged into a coarse entry
	inbox  map[string]inboxSample
	relays map[string]relaySample
}

type history struct {
	mu      sync.Mutex
	fine    []sample
	coarse  []sample
	since   time.Time
	taken   int64
	lastErr string
}

func newHistory() *history { return &history{} }

// add records s.
func (hs *history) add(s sample) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.since.IsZero() || s.at.Before(hs.since) {
		hs.since = s.at
	}
	hs.taken++
	hs.fine = insertSample(hs.fine, s)
	hs.fine = prune(hs.fine, s.at.Add(-time.Hour))
	if len(hs.fine) > maxFine {
		hs.fine = append(hs.fine[:0:0], hs.fine[len(hs.fine)-maxFine:]...)
	}
	hs.addCoarse(s)
	hs.coarse = prune(hs.coarse, s.at.Add(-24*time.Hour))
}

// addCoarse folds s into the newest coarse entry while it is within that entry's
// coarsePeriod, else starts an entry with it.
func (hs *history) addCoarse(s sample) {
	n := len(hs.coarse)
	if n > 0 && !s.at.Before(hs.coarse[n-1].at) && s.at.Sub(hs.coarse[n-1].start) < coarsePeriod {
		hs.coarse[n-1] = merge(hs.coarse[n-1], s)
		return
	}
	s.start = s.at
	hs.coarse = insertSample(hs.coarse, s)
}

// snapshot copies the samples of the day's chart (day) or the hour's, and says how sampling
// has gone.
func (hs *history) snapshot(day bool) ([]sample, operate.SamplingStatus) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	ss := hs.fine
	if day {
		ss = hs.coarse
	}
	return slices.Clone(ss), operate.SamplingStatus{Since: operate.TimePtr(hs.since.UTC()), Samples: hs.taken}
}

// errorChanged records the text of the last sample's error ("" for none) and reports whether
// it differs from the one before.
func (hs *history) errorChanged(msg string) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	changed := msg != hs.lastErr
	hs.lastErr = msg
	return changed
}

// insertSample appends s, keeping the slice in time order (samples normally arrive in order).
func insertSample(ss []sample, s sample) []sample {
	i := sort.Search(len(ss), func(i int) bool { return ss[i].at.After(s.at) })
	ss = append(ss, sample{})
	copy(ss[i+1:], ss[i:])
	ss[i] = s
	return ss
}

// prune drops the samples taken before cutoff.
func prune(ss []sample, cutoff time.Time) []sample {
	i := 0
	for i < len(ss) && ss[i].at.Before(cutoff) {
		i++
	}
	if i == 0 {
		return ss
	}
	return append(ss[:0:0], ss[i:]...)
}

// merge folds s into the coarse entry c: the largest gauges.
func merge(c, s sample) sample {
	out := sample{at: s.at, start: c.start}
	out.inbox = mergeMaps(c.inbox, s.inbox, func(a, b inboxSample) inboxSample {
		return inboxSample{pending: max(a.pending, b.pending), failed: max(a.failed, b.failed), oldestAge: math.Max(a.oldestAge, b.oldestAge)}
	})
	out.relays = mergeMaps(c.relays, s.relays, func(a, b relaySample) relaySample {
		return relaySample{backlog: max(a.backlog, b.backlog), lag: math.Max(a.lag, b.lag)}
	})
	return out
}

func mergeMaps[T any](a, b map[string]T, f func(T, T) T) map[string]T {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	out := make(map[string]T, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if old, ok := out[k]; ok {
			v = f(old, v)
		}
		out[k] = v
	}
	return out
}
