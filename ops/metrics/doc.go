// Package metrics exports watermill-once's figures to Prometheus through a Registerer you
// pass (prometheus/client_golang).
//
//	err := metrics.Register(prometheus.DefaultRegisterer, metrics.Sources{
//		DB: db, Schema: "wmonce",
//		Middlewares: []*once.Middleware{payments},
//		Relays:      []*outbox.Relay{relay},
//		Processors:  []*inbox.Processor{processor},
//		Receivers:   []*inbox.Receiver{receiver},
//		Janitors:    []*retention.Janitor{janitor},
//		Senders:     []*intent.Sender{sender},
//		HTTPIdempotency: []*httpidem.Middleware{idem},
//	})
//
// What it guarantees and where that stops: counters are read from the components' atomic
// totals at scrape time, so the message path pays nothing; database gauges come from
// read-only queries bounded together by Sources.ScrapeTimeout, each through the owning
// package. A failing query never fails the scrape: its gauges are left out of that scrape and
// wmonce_scrape_errors_total{source} goes up. Series of several components with the same
// labels are summed (flags and timestamps take the maximum).
//
// Every metric with its labels, the cost of the queries and the alerts worth having:
// docs/operations.md, Metrics; ops/deploy holds a dashboard and alert rules over them.
package metrics
