package metrics

import (
	"context"
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/outbox"
)

// The gauges below are read from the database at scrape time (the owners' Stats), bounded by
// Sources.ScrapeTimeout.

func (c *collector) collectInboxRows(ctx context.Context, s *series) {
	stats, err := c.ops.AllStats(ctx)
	if err != nil {
		c.readFailed(&c.inboxErrors, "Metrics: could not read inbox stats; inbox gauges left out of this scrape", err)
		return
	}
	var working []string
	for p := range present(c.src.Processors) {
		working = append(working, p.Consumer())
	}
	for _, consumer := range c.remember(c.inboxConsumers, maps.Keys(stats), slices.Values(working)) {
		st := stats[consumer]
		s.add(descInboxRows, prometheus.GaugeValue, float64(st.Pending), consumer, "pending")
		s.add(descInboxRows, prometheus.GaugeValue, float64(st.InProgress), consumer, "in_progress")
		s.add(descInboxRows, prometheus.GaugeValue, float64(st.Failed), consumer, "failed")
		s.add(descRetrying, prometheus.GaugeValue, float64(st.Retrying), consumer)
		s.add(descOldestAge, prometheus.GaugeValue, st.OldestPendingAge.Seconds(), consumer)
		s.add(descInboxPaused, prometheus.GaugeValue, boolValue(!st.PausedAt.IsZero()), consumer)
	}
}

func (c *collector) collectOutbox(ctx context.Context, s *series) {
	relays, rejected, err := outbox.Stats(ctx, c.src.DB, c.src.Schema)
	if err != nil {
		c.readFailed(&c.outboxErrors, "Metrics: could not read outbox stats; outbox gauges left out of this scrape", err)
		return
	}
	for _, r := range relays {
		s.add(descBacklog, prometheus.GaugeValue, float64(r.Backlog), r.Name)
		s.add(descLag, prometheus.GaugeValue, r.Lag.Seconds(), r.Name)
		s.add(descDelayedRows, prometheus.GaugeValue, float64(r.Delayed), r.Name)
		s.add(descRelayPaused, prometheus.GaugeValue, boolValue(!r.PausedAt.IsZero()), r.Name)
		s.add(descRelayMoved, prometheus.GaugeValue, boolValue(r.Moved != ""), r.Name)
		for _, h := range r.Held {
			s.add(descHeldRows, prometheus.GaugeValue, float64(h.Rows), r.Name, h.Topic)
		}
	}
	s.add(descRejected, prometheus.GaugeValue, float64(rejected))
}

func (c *collector) collectIntentRows(ctx context.Context, s *series) {
	backlog, err := c.intents.Backlog(ctx)
	if err != nil {
		c.readFailed(&c.intentErrors, "Metrics: could not read the intent backlog; intent gauges left out of this scrape", err)
		return
	}
	var working []string
	for snd := range present(c.src.Senders) {
		working = append(working, snd.Channels()...)
	}
	// As for the inbox: channels seen before (or worked by a Sender) report 0 once drained.
	for _, channel := range c.remember(c.intentChannels, maps.Keys(backlog), slices.Values(working)) {
		b := backlog[channel]
		s.add(descIntentRows, prometheus.GaugeValue, float64(b.Pending), channel, "pending")
		s.add(descIntentRows, prometheus.GaugeValue, float64(b.Sending), channel, "sending")
		s.add(descIntentRows, prometheus.GaugeValue, float64(b.Failed), channel, "failed")
		s.add(descIntentRows, prometheus.GaugeValue, float64(b.Skipped), channel, "skipped")
		s.add(descIntentRetrying, prometheus.GaugeValue, float64(b.Retrying), channel)
		s.add(descIntentOldestAge, prometheus.GaugeValue, b.OldestPendingAge.Seconds(), channel, "pending")
		s.add(descIntentOldestAge, prometheus.GaugeValue, b.OldestSendingAge.Seconds(), channel, "sending")
	}
}

func (c *collector) collectHTTPKeys(ctx context.Context, s *series) {
	st, err := httpidem.StoredKeys(ctx, c.src.DB, c.src.Schema)
	if err != nil {
		c.readFailed(&c.httpErrors, "Metrics: could not read the stored idempotency keys; their gauges left out of this scrape", err)
		return
	}
	s.add(descHTTPKeys, prometheus.GaugeValue, float64(st.Estimated))
	s.add(descHTTPOldestKey, prometheus.GaugeValue, st.OldestAge.Seconds())
}
