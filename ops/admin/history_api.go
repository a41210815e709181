package admin

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/wmonce/watermill-once/middleware/once"
)

// HistoryResponse is GET /api/history: the charts of one window. Every series has Buckets
// values, the i-th covering [Start + i*BucketSeconds, Start + (i+1)*BucketSeconds); null means
// no sample covers that bucket (before sampling began, or the part could not be read).
type HistoryResponse struct {
	Window        string    `json:"window"`
	Start         time.Time `json:"start"`
	End           time.Time `json:"end"`
	BucketSeconds float64   `json:"bucket_seconds"`
	Buckets       int       `json:"buckets"`
	// Sampling describes the in-memory samples behind the inbox and relay series.
	Sampling SamplingStatus `json:"sampling"`
	// InProcessCounters says whether middlewares were given (Config.Middlewares). The charts no
	// longer need them: claims and duplicates come from the database.
	InProcessCounters bool             `json:"in_process_counters"`
	Consumers         []ConsumerSeries `json:"consumers"`
	Inbox             []InboxSeries    `json:"inbox"`
	Relays            []RelaySeries    `json:"relays"`
}

// SamplingStatus says how far back the sampled series go.
type SamplingStatus struct {
	// IntervalSeconds is Config.SampleInterval (0 when background sampling is off).
	IntervalSeconds float64 `json:"interval_seconds"`
	// Since is the first sample this handler took (nil, null in JSON, before the first).
	Since *time.Time `json:"since"`
	// Samples counts the samples taken since the handler started.
	Samples int64 `json:"samples"`
}

// ConsumerSeries is one consumer's claims and duplicates per bucket, both from the database
// (once.ClaimHistory, once.DuplicateHistory: every process's). Duplicates is never null; the
// type is kept from when it was sampled.
type ConsumerSeries struct {
	Consumer   string   `json:"consumer"`
	Claims     []int64  `json:"claims"`
	Duplicates []*int64 `json:"duplicates"`
}

// InboxSeries is one inbox consumer's sampled backlog per bucket (largest sample in the bucket).
type InboxSeries struct {
	Consumer                string     `json:"consumer"`
	Pending                 []*int64   `json:"pending"`
	Failed                  []*int64   `json:"failed"`
	OldestPendingAgeSeconds []*float64 `json:"oldest_pending_age_seconds"`
}

// RelaySeries is one relay's sampled backlog and lag per bucket (largest sample in the bucket).
type RelaySeries struct {
	Name       string     `json:"name"`
	Backlog    []*int64   `json:"backlog"`
	LagSeconds []*float64 `json:"lag_seconds"`
}

// GET /api/history?window=hour|day[&consumer=C][&relay=R]
func (h *Handler) historyGet(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	window, consumer, relay := q.Get("window"), q.Get("consumer"), q.Get("relay")
	if err := firstError(CheckText("window", window), CheckConsumer("consumer", consumer), CheckText("relay", relay)); err != nil {
		return nil, badRequest("%v", err)
	}
	if window == "" {
		window = "hour"
	}
	w, ok := windows[window]
	if !ok {
		return nil, badRequest("window must be hour or day, got %q", window)
	}
	end := time.Now().Truncate(w.bucket).Add(w.bucket)
	out := HistoryResponse{
		Window: window, Start: end.Add(-w.span).UTC(), End: end.UTC(),
		BucketSeconds: w.bucket.Seconds(), Buckets: int(w.span / w.bucket),
		InProcessCounters: len(h.config.Middlewares) > 0,
		Consumers:         []ConsumerSeries{}, Inbox: []InboxSeries{}, Relays: []RelaySeries{},
	}
	claims, err := once.ClaimHistory(ctx, h.db, h.config.Schema, consumer, out.Start, w.bucket, out.Buckets)
	if err != nil {
		return nil, err
	}
	dupCounts, err := once.DuplicateHistory(ctx, h.db, h.config.Schema, consumer, out.Start, w.bucket, out.Buckets)
	if err != nil {
		return nil, err
	}
	h.history.mu.Lock()
	ss := h.history.fine
	if window == "day" {
		ss = h.history.coarse
	}
	ss = append([]sample(nil), ss...)
	out.Sampling = SamplingStatus{Since: timePtr(h.history.since.UTC()), Samples: h.history.taken}
	h.history.mu.Unlock()
	if h.config.SampleInterval > 0 {
		out.Sampling.IntervalSeconds = h.config.SampleInterval.Seconds()
	}
	b := bucketer{start: out.Start, width: w.bucket, n: out.Buckets}

	// Consumers: those with claims or duplicates in the window.
	names := map[string]bool{}
	for c := range claims {
		names[c] = true
	}
	for c := range dupCounts {
		names[c] = true
	}
	for _, c := range sortedKeys(names) {
		cl := claims[c]
		if cl == nil {
			cl = make([]int64, b.n)
		}
		d := make([]*int64, b.n)
		for i := range d {
			var v int64
			if dupCounts[c] != nil {
				v = dupCounts[c][i]
			}
			d[i] = &v
		}
		out.Consumers = append(out.Consumers, ConsumerSeries{Consumer: c, Claims: cl, Duplicates: d})
	}

	// Inbox and relays: the largest sample per bucket. A consumer or relay absent from a sample
	// that read its part had nothing unfinished (inbox) or did not exist yet (relay).
	inboxes := map[string]*InboxSeries{}
	relays := map[string]*RelaySeries{}
	for _, s := range ss {
		if _, ok := b.index(s.at); !ok {
			continue
		}
		if s.inbox != nil {
			for c := range s.inbox {
				if (consumer == "" || c == consumer) && inboxes[c] == nil {
					inboxes[c] = &InboxSeries{Consumer: c, Pending: make([]*int64, b.n), Failed: make([]*int64, b.n), OldestPendingAgeSeconds: make([]*float64, b.n)}
				}
			}
		}
		if s.relays != nil {
			for name := range s.relays {
				if (relay == "" || name == relay) && relays[name] == nil {
					relays[name] = &RelaySeries{Name: name, Backlog: make([]*int64, b.n), LagSeconds: make([]*float64, b.n)}
				}
			}
		}
	}
	for _, s := range ss {
		k, ok := b.index(s.at)
		if !ok {
			continue
		}
		if s.inbox != nil {
			for c, series := range inboxes {
				v := s.inbox[c]
				maxInt(&series.Pending[k], v.pending)
				maxInt(&series.Failed[k], v.failed)
				maxFloat(&series.OldestPendingAgeSeconds[k], v.oldestAge)
			}
		}
		if s.relays != nil {
			for name, series := range relays {
				if v, ok := s.relays[name]; ok {
					maxInt(&series.Backlog[k], v.backlog)
					maxFloat(&series.LagSeconds[k], v.lag)
				}
			}
		}
	}
	for _, c := range sortedKeys(inboxes) {
		out.Inbox = append(out.Inbox, *inboxes[c])
	}
	for _, name := range sortedKeys(relays) {
		out.Relays = append(out.Relays, *relays[name])
	}
	return out, nil
}

type bucketer struct {
	start time.Time
	width time.Duration
	n     int
}

func (b bucketer) index(t time.Time) (int, bool) {
	if t.Before(b.start) {
		return 0, false
	}
	k := int(t.Sub(b.start) / b.width)
	return k, k < b.n
}

func maxInt(p **int64, v int64) {
	if *p == nil || **p < v {
		*p = &v
	}
}

func maxFloat(p **float64, v float64) {
	if *p == nil || **p < v {
		*p = &v
	}
}

func sortedKeys[T any](m map[string]T) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
