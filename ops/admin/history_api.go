package admin

import (
	"cmp"
	"context"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/wmonce/watermill-once/internal/claims"
	"github.com/wmonce/watermill-once/internal/operate"
)

// GET /api/history?window=hour|day[&consumer=C][&relay=R]
func (h *Handler) historyGet(ctx context.Context, r *http.Request) (any, error) {
	q := r.URL.Query()
	window, consumer, relay := cmp.Or(q.Get("window"), "hour"), q.Get("consumer"), q.Get("relay")
	w, ok := windows[window]
	if err := operate.FirstError(inputError(operate.CheckConsumer("consumer", consumer)), badRequestIf(!ok, "window must be hour or day, got %q", window)); err != nil {
		return nil, err
	}
	end := time.Now().Truncate(w.bucket).Add(w.bucket)
	out := operate.HistoryResponse{
		Window: window, Start: end.Add(-w.span).UTC(), End: end.UTC(),
		BucketSeconds: w.bucket.Seconds(), Buckets: int(w.span / w.bucket),
		InProcessCounters: len(h.config.Middlewares) > 0,
		Consumers:         []operate.ConsumerSeries{}, Inbox: []operate.InboxSeries{}, Relays: []operate.RelaySeries{},
	}
	claimCounts, err := claims.ClaimHistory(ctx, h.db, h.config.Schema, consumer, out.Start, w.bucket, out.Buckets)
	if err != nil {
		return nil, err
	}
	dupCounts, err := claims.DuplicateHistory(ctx, h.db, h.config.Schema, consumer, out.Start, w.bucket, out.Buckets)
	if err != nil {
		return nil, err
	}
	ss, sampling := h.history.snapshot(window == "day")
	out.Sampling = sampling
	out.Sampling.IntervalSeconds = max(h.config.SampleInterval, 0).Seconds()
	b := bucketer{start: out.Start, width: w.bucket, n: out.Buckets}
	out.Consumers = append(out.Consumers, consumerSeries(b, claimCounts, dupCounts)...)
	inboxes, relays := sampledSeries(b, ss, consumer, relay)
	out.Inbox = append(out.Inbox, inboxes...)
	out.Relays = append(out.Relays, relays...)
	return out, nil
}

// consumerSeries are the claims and duplicates of each consumer with any in the window.
func consumerSeries(b bucketer, claimCounts, dupCounts map[string][]int64) []operate.ConsumerSeries {
	names := map[string][]int64{}
	maps.Copy(names, claimCounts)
	maps.Copy(names, dupCounts)
	var out []operate.ConsumerSeries
	for _, c := range sortedKeys(names) {
		out = append(out, operate.ConsumerSeries{Consumer: c, Claims: orZeros(claimCounts[c], b.n), Duplicates: pointers(orZeros(dupCounts[c], b.n))})
	}
	return out
}

// orZeros is counts, or n zeros when there are none.
func orZeros(counts []int64, n int) []int64 {
	if counts == nil {
		return make([]int64, n)
	}
	return counts
}

// pointers points at each of vs, as the series whose buckets may be unknown (null) do.
func pointers(vs []int64) []*int64 {
	out := make([]*int64, len(vs))
	for i := range vs {
		out[i] = &vs[i]
	}
	return out
}

// sampledSeries are the inbox and relay series of the samples ss (of consumer and relay, or
// all when ""): the largest sample per bucket. A consumer or relay absent from a sample that
// read its part had nothing unfinished (inbox) or did not exist yet (relay).
func sampledSeries(b bucketer, ss []sample, consumer, relay string) ([]operate.InboxSeries, []operate.RelaySeries) {
	inboxes := map[string]*operate.InboxSeries{}
	relays := map[string]*operate.RelaySeries{}
	for _, s := range ss {
		if _, ok := b.index(s.at); ok {
			addInboxSeries(inboxes, s, consumer, b.n)
			addRelaySeries(relays, s, relay, b.n)
		}
	}
	for _, s := range ss {
		if k, ok := b.index(s.at); ok {
			s.maxInto(k, inboxes, relays)
		}
	}
	in := make([]operate.InboxSeries, 0, len(inboxes))
	for _, c := range sortedKeys(inboxes) {
		in = append(in, *inboxes[c])
	}
	rs := make([]operate.RelaySeries, 0, len(relays))
	for _, name := range sortedKeys(relays) {
		rs = append(rs, *relays[name])
	}
	return in, rs
}

func addInboxSeries(series map[string]*operate.InboxSeries, s sample, consumer string, n int) {
	for c := range s.inbox {
		if (consumer == "" || c == consumer) && series[c] == nil {
			series[c] = &operate.InboxSeries{Consumer: c, Pending: make([]*int64, n), Failed: make([]*int64, n), OldestPendingAgeSeconds: make([]*float64, n)}
		}
	}
}

func addRelaySeries(series map[string]*operate.RelaySeries, s sample, relay string, n int) {
	for name := range s.relays {
		if (relay == "" || name == relay) && series[name] == nil {
			series[name] = &operate.RelaySeries{Name: name, Backlog: make([]*int64, n), LagSeconds: make([]*float64, n)}
		}
	}
}

// maxInto raises bucket k of each series to this sample's value where it is larger. A
// sample whose inbox or relay part could not be read (nil) leaves the buckets alone.
func (s sample) maxInto(k int, inboxes map[string]*operate.InboxSeries, relays map[string]*operate.RelaySeries) {
	if s.inbox != nil {
		for c, series := range inboxes {
			v := s.inbox[c]
			maxInt(&series.Pending[k], v.pending)
			maxInt(&series.Failed[k], v.failed)
			maxFloat(&series.OldestPendingAgeSeconds[k], v.oldestAge)
		}
	}
	if s.relays == nil {
		return
	}
	for name, series := range relays {
		if v, ok := s.relays[name]; ok {
			maxInt(&series.Backlog[k], v.backlog)
			maxFloat(&series.LagSeconds[k], v.lag)
		}
	}
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
	return slices.Sorted(maps.Keys(m))
}
