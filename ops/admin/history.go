package admin

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// What the charts show, and where each series comes from:
//
//   - claims: rows in processed_messages and processed_messages_daily by processed_at, counted
//     by the database for the whole window (once.ClaimHistory). Real history, from every process, as long as
//     retention keeps the rows.
//   - duplicates: a duplicate leaves no row (the claim is ON CONFLICT DO NOTHING), so the only
//     record is the middlewares' in-process counters. The handler samples them; a bucket holds
//     the increase between consecutive samples. This process only, and only since sampling
//     began.
//   - inbox pending, failed, oldest pending age and relay backlog and lag: the database holds
//     only their present value (outbox.Stats, inbox.Ops.AllStats), so the handler samples
//     them; a bucket holds the largest sampled value.

// Windows the charts cover: the last hour in one-minute buckets, the last day in 15-minute
// buckets.
var windows = map[string]struct{ span, bucket time.Duration }{
	"hour": {time.Hour, time.Minute},
	"day":  {24 * time.Hour, 15 * time.Minute},
}

// coarsePeriod is the resolution of the day's samples: each entry summarises the samples of up
// to this long (largest gauge values, duplicates added up), so a day costs 288 entries.
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
	at    time.Time
	start time.Time // the first sample merged into a coarse entry
	// dups is the increase of each consumer's duplicates count since the sample taken before
	// (a consumer new since then counts from zero); nil for the first sample with counts, which
	// is only the baseline.
	dups   map[string]int64
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
	// counts are the middlewares' counts at the last sample that read them.
	counts map[string]once.Counters
}

func newHistory() *history { return &history{} }

// add records s, with counts the middlewares' counts at s.at (nil: none given).
func (hs *history) add(s sample, counts map[string]once.Counters) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if counts != nil {
		if hs.counts != nil {
			s.dups = make(map[string]int64, len(counts))
			for c, now := range counts {
				s.dups[c] = int64(now.Duplicates - hs.counts[c].Duplicates)
			}
		}
		hs.counts = counts
	}
	if hs.since.IsZero() || s.at.Before(hs.since) {
		hs.since = s.at
	}
	hs.taken++
	hs.fine = insertSample(hs.fine, s)
	hs.fine = prune(hs.fine, s.at.Add(-time.Hour))
	if len(hs.fine) > maxFine {
		hs.fine = append(hs.fine[:0:0], hs.fine[len(hs.fine)-maxFine:]...)
	}
	n := len(hs.coarse)
	if n > 0 && !s.at.Before(hs.coarse[n-1].at) && s.at.Sub(hs.coarse[n-1].start) < coarsePeriod {
		hs.coarse[n-1] = merge(hs.coarse[n-1], s)
	} else {
		s.start = s.at
		hs.coarse = insertSample(hs.coarse, s)
	}
	hs.coarse = prune(hs.coarse, s.at.Add(-24*time.Hour))
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

// merge folds s into the coarse entry c: duplicates added up, the largest gauges.
func merge(c, s sample) sample {
	out := sample{at: s.at, start: c.start}
	out.dups = mergeMaps(c.dups, s.dups, func(a, b int64) int64 { return a + b })
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

// Sample reads the inbox backlog, every relay's backlog and lag (outbox.Stats) and the
// middlewares' counts once and adds them to the history the charts show. The background
// sampler calls it every Config.SampleInterval; call it yourself to sample on your own
// schedule (with a negative SampleInterval). Parts that cannot be read are left out of the
// sample and their errors returned; the rest is kept.
func (h *Handler) Sample(ctx context.Context) error {
	return h.sampleAt(ctx, time.Now())
}

func (h *Handler) sampleAt(ctx context.Context, at time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, h.config.QueryTimeout)
	defer cancel()
	s := sample{at: at}
	var errs []error
	if stats, err := h.ops.AllStats(ctx); err != nil {
		errs = append(errs, err)
	} else {
		s.inbox = make(map[string]inboxSample, len(stats))
		for c, st := range stats {
			s.inbox[c] = inboxSample{pending: st.Pending, failed: st.Failed, oldestAge: st.OldestPendingAge.Seconds()}
		}
	}
	if relays, _, err := outbox.Stats(ctx, h.db, h.config.Schema); err != nil {
		errs = append(errs, err)
	} else {
		s.relays = make(map[string]relaySample, len(relays))
		for _, r := range relays {
			s.relays[r.Name] = relaySample{backlog: r.Backlog, lag: r.Lag.Seconds()}
		}
	}
	var counts map[string]once.Counters
	if len(h.config.Middlewares) > 0 {
		counts = sumCounts(h.config.Middlewares)
	}
	h.history.add(s, counts)
	return errors.Join(errs...)
}

func (h *Handler) sampleLoop(ctx context.Context) {
	defer close(h.stopped)
	t := time.NewTicker(h.config.SampleInterval)
	defer t.Stop()
	for {
		h.sampleAndLog(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleAndLog takes a sample and logs its failure once, not every interval (an unmigrated
// schema would fill the log); a failure that changes is logged again. Missing tables are the
// operator's to fix, as the API's 503 says, so they are logged at info level.
func (h *Handler) sampleAndLog(ctx context.Context) {
	err := h.Sample(ctx)
	if ctx.Err() != nil {
		return
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	h.history.mu.Lock()
	changed := msg != h.history.lastErr
	h.history.lastErr = msg
	h.history.mu.Unlock()
	switch {
	case !changed || err == nil:
	case pgtx.IsUndefinedTable(err):
		h.logger.Info("Admin history samples nothing: the schema lacks watermill-once tables (logged again when this changes)", watermill.LogFields{
			"schema": h.config.Schema, "error": msg, "fix": fmt.Sprintf("wmonce -schema %s migrate up", h.config.Schema)})
	default:
		h.logger.Error("Admin history sample failed (logged again when the error changes)", err, nil)
	}
}

// HistoryResponse is GET /api/history: the charts of one window. Every series has Buckets
// values, the i-th covering [Start + i*BucketSeconds, Start + (i+1)*BucketSeconds); null means
// no sample covers that bucket (before sampling began, or the part could not be read).
type HistoryResponse struct {
	Window        string    `json:"window"`
	Start         time.Time `json:"start"`
	End           time.Time `json:"end"`
	BucketSeconds float64   `json:"bucket_seconds"`
	Buckets       int       `json:"buckets"`
	// Sampling describes the in-memory samples behind every series but claims.
	Sampling SamplingStatus `json:"sampling"`
	// InProcessCounters says whether middlewares were given: without them duplicates are null.
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

// ConsumerSeries is one consumer's claims (from the database) and duplicates (sampled from the
// in-process counters) per bucket.
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

	// Consumers: those with claims in the window and those the middlewares counted. A bucket
	// adds up the duplicates its samples saw since the sample before each.
	dups := map[string][]*int64{}
	for _, s := range ss {
		k, ok := b.index(s.at)
		if !ok {
			continue
		}
		for c, d := range s.dups {
			if consumer != "" && c != consumer {
				continue
			}
			if dups[c] == nil {
				dups[c] = make([]*int64, b.n)
			}
			if dups[c][k] == nil {
				dups[c][k] = new(int64)
			}
			*dups[c][k] += d
		}
	}
	names := map[string]bool{}
	for c := range claims {
		names[c] = true
	}
	for c := range dups {
		names[c] = true
	}
	for _, c := range sortedKeys(names) {
		cl := claims[c]
		if cl == nil {
			cl = make([]int64, b.n)
		}
		d := dups[c]
		if d == nil {
			d = make([]*int64, b.n)
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
