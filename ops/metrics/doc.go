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
// From the effectively-once middleware (once.Middleware.Counters: its Series and group-commit
// counts):
//
//	wmonce_claims_total{consumer,sender,result}        counter  result=fresh (applied and committed) | duplicate (skipped, acked)
//	wmonce_fingerprint_mismatches_total{consumer,sender} counter duplicates whose payload differed from the applied copy
//	wmonce_handler_outcomes_total{consumer,outcome}    counter  outcome=applied | failed (rolled back, redelivered) | refused (bad key or metadata) | too_old (age guard)
//	wmonce_tx_retries_total{consumer}                  counter  transactions re-run after a serialization failure or deadlock
//	wmonce_group_commit_transactions_total             counter  group-commit transactions committed
//	wmonce_group_commit_messages_total                 counter  messages applied in them (ratio: average group size)
//
// From inbox receivers and processors (Counters):
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
//	wmonce_inbox_handler_ended_tx_total{consumer}      counter  attempts whose handler ended its transaction (nothing applied, row parked)
//
// From both (once.Counters.HandlerAcked, inbox.ProcessorCounters.HandlerAcked):
//
//	wmonce_handler_acked_total{component,consumer}     counter  handler runs that acked or nacked their own message (ignored)
//
// From the database at scrape time (needs Sources.DB):
//
//	wmonce_inbox_rows{consumer,status}                 gauge    status=pending | in_progress | failed
//	wmonce_inbox_retrying_rows{consumer}               gauge    pending rows that failed before
//	wmonce_inbox_oldest_pending_age_seconds{consumer}  gauge    age of the oldest PENDING row (alert on it)
//	wmonce_outbox_backlog{relay}                       gauge    rows committed after the relay's position
//	wmonce_outbox_lag_seconds{relay}                   gauge    age of the oldest row not yet published
//	wmonce_outbox_rejected                             gauge    rows in outbox_rejected (undecodable, or refused by the broker for good)
//	wmonce_outbox_held_rows{relay,topic}               gauge    rows held because publishing to topic fails (a series per held topic: alert on it)
//	wmonce_outbox_delayed_rows{relay}                  gauge    rows waiting in outbox_delayed for their delivery time (not in the backlog)
//	wmonce_outbox_paused{relay}                        gauge    1 while the relay is paused (outbox.PauseRelay)
//	wmonce_outbox_position_moved{relay}                gauge    1 while the relay's position is of another cluster (a restore): it forwards nothing until `wmonce rebase`
//	wmonce_inbox_paused{consumer}                      gauge    1 while the inbox consumer is paused (inbox.Ops.Pause)
//	wmonce_intent_rows{channel,status}                 gauge    unfinished intents, status=pending | sending | failed | skipped (needs Senders)
//	wmonce_intent_retrying_rows{channel}               gauge    pending intents a sender took before (waiting out a backoff)
//	wmonce_intent_oldest_age_seconds{channel,status}   gauge    age since recorded of the oldest intent, status=pending | sending
//	wmonce_http_idempotency_keys                       gauge    stored responses, live and expired: planner estimate (needs HTTPIdempotency)
//	wmonce_http_idempotency_oldest_key_age_seconds     gauge    age of the oldest stored response
//	wmonce_scrape_errors_total{source}                 counter  failed scrape queries, source=inbox | outbox | intent | http_idempotency
//
// From outbox relays (Relay.Counters):
//
//	wmonce_relay_forwarded_total{relay}                counter  messages published
//	wmonce_relay_failures_total{relay}                 counter  failed publish or database attempts (retried)
//	wmonce_relay_rejected_total{relay}                 counter  rows set aside in outbox_rejected
//	wmonce_relay_held_total{relay}                     counter  rows copied into outbox_held (their topic was failing)
//	wmonce_relay_fenced_total{relay}                   counter  position updates refused (another instance moved it)
//	wmonce_relay_rechecks_total{relay}                 counter  short re-reads for transactions in progress when the relay asked to be notified
//	wmonce_relay_leader{relay}                         gauge    1 while this process leads the relay
//
// From retention janitors (retention.Janitor.Counters and Warnings):
//
//	wmonce_janitor_deleted_total{table}                counter  rows deleted; table=processed_messages | inbox | outbox | http_idempotency_keys
//	wmonce_janitor_partitions_dropped_total            counter  days of processed_messages_daily dropped
//	wmonce_janitor_rounds_total{result}                counter  rounds, result=ok | failed
//	wmonce_janitor_leader                              gauge    1 while a janitor of this process leads
//	wmonce_janitor_last_round_timestamp_seconds        gauge    Unix time of the last round (0 before the first)
//	wmonce_retention_warnings                          gauge    windows shorter than their declared redelivery horizon
//
// From intent senders (intent.Sender.Counters), summed over the Senders:
//
//	wmonce_intent_sent_total                           counter  intents recorded SENT (provider confirmed, or found by a reconcile lookup)
//	wmonce_intent_retries_total                        counter  sends answered NotSent, put back PENDING with backoff
//	wmonce_intent_unknown_outcomes_total               counter  sends with an unknown outcome, handed to the channel's CrashPolicy
//	wmonce_intent_parked_total{status}                 counter  intents parked, status=failed | skipped
//	wmonce_intent_leases_expired_total                 counter  intents taken back from SENDING after their lease ran out
//	wmonce_intent_reconciled_total                     counter  of those, found at the provider by Lookup (not sent again)
//	wmonce_intent_lease_conflicts_total                counter  outcomes not recorded: another sender had taken the intent over
//	wmonce_intent_released_total                       counter  intents given back by a stopping sender
//	wmonce_intent_sender_errors_total                  counter  database errors (retried)
//
// From HTTP Idempotency-Key middlewares (httpidem.Middleware.Counters), summed:
//
//	wmonce_http_idempotency_requests_total{result}     counter  result=stored | duplicate (replayed) | conflict (409) |
//	                                                            fingerprint_mismatch (422) | refused (400, 413) |
//	                                                            failed (handler 5xx, rolled back, not stored) |
//	                                                            error (500: lookup, store or commit failed, or the
//	                                                            handler ended the transaction) | keyless
//	wmonce_http_idempotency_handler_ended_tx_total     counter  requests whose handler ended the request's transaction
//	                                                            (500, nothing applied, key not stored; also in result=error)
//
// Counters.Replayed is result=duplicate, Counters.NotStored is result=failed (the handler failed, as
// outcome=failed of the middleware) and Counters.Failed is result=error (the middleware's own
// database failure). A keyless request (AllowMissingKey) whose commit then fails counts in both
// keyless and error.
//
// Alerts worth having: wmonce_inbox_rows{status="failed"} > 0,
// increase(wmonce_inbox_handler_ended_tx_total) > 0 and
// increase(wmonce_http_idempotency_handler_ended_tx_total) > 0 (a handler commits or rolls back
// the transaction it was lent: a bug to fix, its messages are parked or its requests fail), a growing
// wmonce_inbox_oldest_pending_age_seconds or wmonce_outbox_lag_seconds,
// increase(wmonce_handler_outcomes_total{outcome="too_old"}) > 0,
// increase(wmonce_fingerprint_mismatches_total) > 0, wmonce_retention_warnings > 0,
// time() - wmonce_janitor_last_round_timestamp_seconds well above the janitor's PollInterval on the
// leading instance; for intents, wmonce_intent_rows{status=~"failed|skipped"} > 0 (parked:
// someone must requeue or settle them), a growing wmonce_intent_oldest_age_seconds (pending: no
// sender keeps up; sending: an intent stays in doubt) and
// increase(wmonce_intent_lease_conflicts_total) > 0 (a sender outlived its lease); for HTTP,
// increase(wmonce_http_idempotency_requests_total{result="error"}) > 0 and
// wmonce_http_idempotency_oldest_key_age_seconds well above Retention (expired keys are not
// deleted: run Prune or the janitor).
package metrics
