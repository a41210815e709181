// Package metrics exports watermill-once's figures to Prometheus through a Registerer you
// pass (prometheus/client_golang).
//
//	err := metrics.Register(prometheus.DefaultRegisterer, metrics.Sources{
//		DB: db, Schema: "wmonce",
//		Middlewares: []*middleware.EffectivelyOnce{payments},
//		Relays:      []*outbox.Relay{relay},
//		Processors:  []*inbox.Processor{processor},
//		Receivers:   []*inbox.Receiver{receiver},
//		Janitors:    []*retention.Janitor{janitor},
//	})
//
// # Cost and failure
//
// One collector reads the components' atomic running totals when the registry is gathered,
// so the message path pays nothing and the core packages do not depend on Prometheus. With a
// DB, each scrape also runs two read-only queries bounded by ScrapeTimeout (default 5s): inbox
// rows per consumer and status (through the inbox's partial work index, so their cost follows
// the backlog, not the table) and outbox backlog per relay (outbox.Status). A query that fails
// or times out never fails the scrape: its gauges are left out of that scrape,
// wmonce_scrape_errors_total{source} goes up and the error is logged. A consumer whose inbox
// backlog drained is reported at 0 rather than disappearing.
//
// Series of several components with the same labels are summed (flags and timestamps take the
// maximum). Relay, processor and receiver series are labelled with the relay or consumer name
// when those types offer a Name() or Consumer() accessor; until they do, the label is empty and
// the components of one kind are summed. The sender label comes from
// middleware.Config.SenderMetadataKey (empty when unset); the middleware caps it at 100 senders
// per consumer ("_other" beyond), and invalid UTF-8 is replaced.
//
// # Metrics
//
// From the effectively-once middleware (middleware.EffectivelyOnce.CountsBySender and
// GroupCommitStats):
//
//	wmonce_claims_total{consumer,sender,result}        counter  result=fresh (applied and committed) | duplicate (skipped, acked)
//	wmonce_fingerprint_mismatches_total{consumer,sender} counter duplicates whose payload differed from the applied copy
//	wmonce_handler_outcomes_total{consumer,outcome}    counter  outcome=applied | failed (rolled back, redelivered) | refused (bad key or metadata) | too_old (age guard)
//	wmonce_tx_retries_total{consumer}                  counter  transactions re-run after a serialization failure or deadlock
//	wmonce_group_commit_transactions_total             counter  group-commit transactions committed
//	wmonce_group_commit_messages_total                 counter  messages applied in them (ratio: average group size)
//
// From inbox receivers and processors (Counts):
//
//	wmonce_inbox_received_total{consumer,result}       counter  result=stored | duplicate | refused
//	wmonce_inbox_receive_batches_total{consumer,result} counter result=committed | failed
//	wmonce_inbox_claimed_total{consumer}               counter  rows claimed
//	wmonce_inbox_processed_total{consumer}             counter  rows moved to DONE
//	wmonce_inbox_failed_attempts_total{consumer}       counter  failed attempts (retried or parked)
//	wmonce_inbox_parked_total{consumer}                counter  rows parked as FAILED
//	wmonce_inbox_lease_conflicts_total{consumer}       counter  changes refused because the lease had been lost
//	wmonce_inbox_leases_expired_total{consumer}        counter  expired leases taken back
//	wmonce_inbox_released_total{consumer}              counter  rows given back unprocessed
//	wmonce_inbox_processor_errors_total{consumer}      counter  database errors outside handlers
//
// From the database at scrape time (needs Sources.DB):
//
//	wmonce_inbox_rows{consumer,status}                 gauge    status=pending | in_progress | failed
//	wmonce_inbox_retrying_rows{consumer}               gauge    pending rows that failed before
//	wmonce_inbox_oldest_pending_age_seconds{consumer}  gauge    age of the oldest PENDING row (alert on it)
//	wmonce_outbox_backlog{relay}                       gauge    rows committed after the relay's position
//	wmonce_outbox_lag_seconds{relay}                   gauge    age of the oldest row not yet published
//	wmonce_outbox_rejected                             gauge    rows in outbox_rejected
//	wmonce_scrape_errors_total{source}                 counter  failed scrape queries, source=inbox | outbox
//
// From outbox relays (Relay.Stats):
//
//	wmonce_relay_forwarded_total{relay}                counter  messages published
//	wmonce_relay_failures_total{relay}                 counter  failed publish or database attempts (retried)
//	wmonce_relay_rejected_total{relay}                 counter  rows set aside in outbox_rejected
//	wmonce_relay_fenced_total{relay}                   counter  position updates refused (another instance moved it)
//	wmonce_relay_leader{relay}                         gauge    1 while this process leads the relay
//
// From retention janitors (retention.Janitor.Stats and Warnings):
//
//	wmonce_janitor_deleted_total{table}                counter  rows deleted; table=processed_messages | inbox | outbox | http_idempotency_keys
//	wmonce_janitor_partitions_dropped_total            counter  days of processed_messages_daily dropped
//	wmonce_janitor_rounds_total{result}                counter  rounds, result=ok | failed
//	wmonce_janitor_leader                              gauge    1 while a janitor of this process leads
//	wmonce_janitor_last_round_timestamp_seconds        gauge    Unix time of the last round (0 before the first)
//	wmonce_retention_warnings                          gauge    windows shorter than their declared redelivery horizon
//
// Alerts worth having: wmonce_inbox_rows{status="failed"} > 0, a growing
// wmonce_inbox_oldest_pending_age_seconds or wmonce_outbox_lag_seconds,
// increase(wmonce_handler_outcomes_total{outcome="too_old"}) > 0,
// increase(wmonce_fingerprint_mismatches_total) > 0, wmonce_retention_warnings > 0, and
// time() - wmonce_janitor_last_round_timestamp_seconds well above the janitor's Interval on the
// leading instance.
package metrics
