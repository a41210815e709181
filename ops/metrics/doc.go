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
// # Cost and failure
//
// One collector reads the components' atomic running totals when the registry is gathered,
// so the message path pays nothing and the core packages do not depend on Prometheus. With a
// DB, each scrape also runs read-only queries, all bounded together by ScrapeTimeout (default
// 5s): inbox rows per consumer and status (through the inbox's partial work index, so their
// cost follows the backlog, not the table) and outbox backlog per relay (outbox.Stats); with
// Senders, the unfinished intents per channel (intent.Store.Backlog, through the intents'
// partial indexes: SENT rows are never read); with HTTPIdempotency, the stored keys
// (httpidem.StoredKeys: a catalog estimate and one index probe). Each table is read by the
// package that owns it. A query that fails or times out never fails the scrape: its gauges are
// left out of that scrape, wmonce_scrape_errors_total{source} goes up and the error is logged.
// A consumer whose inbox backlog drained, or an intent channel that drained (or that a Sender
// works but has no intents yet), is reported at 0 rather than missing.
//
// Series of several components with the same labels are summed (flags and timestamps take the
// maximum). Relay, processor and receiver series are labelled with the relay or consumer name
// when those types offer a Name() or Consumer() accessor; until they do, the label is empty and
// the components of one kind are summed. Intent senders and HTTP idempotency middlewares
// carry no label: their counts are summed over the components given (a Sender does not count
// per channel; wmonce_intent_rows is per channel). The sender label comes from
// once.Config.SenderMetadataKey (empty when unset); the middleware caps it at 100 senders
// per consumer ("_other" beyond), and invalid UTF-8 is replaced.
//
// # Metrics
//
// Every metric with its labels, and the alerts worth having, are listed in docs/operations.md
// (section Metrics); ops/deploy holds a dashboard and alert rules over them.
package metrics
