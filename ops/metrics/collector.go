package metrics

import (
	"context"
	"iter"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/inbox"
)

// collector reads the components' in-process counts (counters.go) and the database's figures
// (stats.go) at each scrape.
type collector struct {
	src     Sources
	ops     *inbox.Ops
	intents *intent.Store // nil without DB or Senders

	inboxErrors, outboxErrors, intentErrors, httpErrors atomic.Uint64

	mu             sync.Mutex
	inboxConsumers map[string]bool // seen at earlier scrapes: reported as 0 once drained
	intentChannels map[string]bool // likewise
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := newSeries()
	c.collectMiddlewares(s)
	c.collectInboxComponents(s)
	c.collectRelays(s)
	c.collectJanitors(s)
	c.collectSenders(s)
	c.collectHTTPIdempotency(s)
	if c.src.DB != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.src.ScrapeTimeout)
		c.collectInboxRows(ctx, s)
		c.collectOutbox(ctx, s)
		if c.intents != nil {
			c.collectIntentRows(ctx, s)
		}
		if len(c.src.HTTPIdempotency) > 0 {
			c.collectHTTPKeys(ctx, s)
		}
		cancel()
		s.add(descScrapeErrors, prometheus.CounterValue, float64(c.inboxErrors.Load()), "inbox")
		s.add(descScrapeErrors, prometheus.CounterValue, float64(c.outboxErrors.Load()), "outbox")
		if c.intents != nil {
			s.add(descScrapeErrors, prometheus.CounterValue, float64(c.intentErrors.Load()), "intent")
		}
		if len(c.src.HTTPIdempotency) > 0 {
			s.add(descScrapeErrors, prometheus.CounterValue, float64(c.httpErrors.Load()), "http_idempotency")
		}
	}
	s.flush(ch)
}

// remember adds the labels of this scrape to seen and returns every label seen so far. Labels
// seen before whose backlog drained are then reported at 0 rather than vanishing, so that
// alerts and graphs see the recovery.
func (c *collector) remember(seen map[string]bool, labels ...iter.Seq[string]) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ls := range labels {
		for l := range ls {
			seen[l] = true
		}
	}
	return slices.Collect(maps.Keys(seen))
}

// readFailed counts a database read of a scrape that failed under errs (reported as
// wmonce_scrape_errors_total) and logs msg with the error.
func (c *collector) readFailed(errs *atomic.Uint64, msg string, err error) {
	errs.Add(1)
	c.src.Logger.Error(msg, err, nil)
}
