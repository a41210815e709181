package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The metrics of the collector: one descriptor each; desc lists it in allDescs, which
// Describe sends.

// allDescs is every descriptor desc made, in the order of the declarations below.
var allDescs []*prometheus.Desc

func desc(name, help string, labels ...string) *prometheus.Desc {
	d := prometheus.NewDesc(name, help, labels, nil)
	allDescs = append(allDescs, d)
	return d
}

var (
	descClaims       = desc("wmonce_claims_total", "Messages the effectively-once middleware claimed: result=fresh (applied and committed) or duplicate (key already claimed, skipped and acked).", "consumer", "sender", "result")
	descMismatches   = desc("wmonce_fingerprint_mismatches_total", "Duplicates whose payload differed from the applied copy's: two different events share one id.", "consumer", "sender")
	descOutcomes     = desc("wmonce_handler_outcomes_total", "Outcomes of messages at the effectively-once middleware: applied (committed), failed (rolled back, redelivered), refused (unusable key or metadata), too_old (refused by the age guard), handler_ended_tx (the handler committed or rolled back the transaction it was lent: nothing applied, a permanent failure).", "consumer", "outcome")
	descDelayed      = desc("wmonce_delayed_retries_total", "Failed messages the Stack's delayed retries handled (StackConfig.DelayedRetries): result=scheduled (stored in the outbox for later, delivery acked) or nacked (could not be scheduled: no topic, outbox or database error).", "consumer", "result")
	descTxRetries    = desc("wmonce_tx_retries_total", "Middleware transactions run again after a serialization failure or deadlock.", "consumer")
	descGroupTx      = desc("wmonce_group_commit_transactions_total", "Group-commit transactions committed.")
	descGroupMsgs    = desc("wmonce_group_commit_messages_total", "Messages applied in group-commit transactions (divided by transactions: the average group size).")
	descReceived     = desc("wmonce_inbox_received_total", "Messages handled by inbox receivers: result=stored (new row committed), duplicate (key already in the inbox, acked), refused (unusable key or metadata), too_old (parked as FAILED by the age guard).", "consumer", "result")
	descRecvBatches  = desc("wmonce_inbox_receive_batches_total", "Inbox receiver insert statements: result=committed or failed (their messages were retried or nacked).", "consumer", "result")
	descInboxClaimed = desc("wmonce_inbox_claimed_total", "Inbox rows claimed by processors.", "consumer")
	descInboxDone    = desc("wmonce_inbox_processed_total", "Inbox rows processed (moved to DONE).", "consumer")
	descInboxFailed  = desc("wmonce_inbox_failed_attempts_total", "Failed inbox processing attempts (handler error or panic, timeout, output refused); each is retried or parked.", "consumer")
	descInboxParked  = desc("wmonce_inbox_parked_total", "Inbox rows parked as FAILED by processors.", "consumer")
	descLeaseConfl   = desc("wmonce_inbox_lease_conflicts_total", "Inbox changes refused because the worker's lease had expired and the row was claimed again.", "consumer")
	descLeaseExp     = desc("wmonce_inbox_leases_expired_total", "Expired inbox leases taken back by processors.", "consumer")
	descReleased     = desc("wmonce_inbox_released_total", "Inbox rows given back unprocessed (shutdown, database trouble).", "consumer")
	descInboxErrors  = desc("wmonce_inbox_processor_errors_total", "Database errors of inbox processors outside handlers (claim, commit, renewal, reaping).", "consumer")
	descInboxEndedTx = desc("wmonce_inbox_handler_ended_tx_total", "Inbox attempts whose handler called Commit or Rollback on the processing transaction it was lent: nothing of them was applied, and each parked its row (also counted in wmonce_inbox_failed_attempts_total).", "consumer")
	descHandlerAcked = desc("wmonce_handler_acked_total", "Handler runs that called Ack or Nack on the message they were given (component=once or inbox): ignored, since a handler gets a message of its own and the delivery is acked only after the commit; a handler written for a bare subscriber loop.", "component", "consumer")
	descInboxRows    = desc("wmonce_inbox_rows", "Unfinished inbox rows by status (pending, in_progress, failed), read from the database.", "consumer", "status")
	descRetrying     = desc("wmonce_inbox_retrying_rows", "Pending inbox rows that failed before and wait for another attempt (part of status=pending).", "consumer")
	descOldestAge    = desc("wmonce_inbox_oldest_pending_age_seconds", "Age of the oldest PENDING inbox row by the database clock; 0 when none. Alert when it grows.", "consumer")
	descBacklog      = desc("wmonce_outbox_backlog", "Outbox rows committed after the relay's position: waiting to be published.", "relay")
	descLag          = desc("wmonce_outbox_lag_seconds", "Age of the oldest outbox row the relay has not published yet; 0 when caught up.", "relay")
	descRejected     = desc("wmonce_outbox_rejected", "Rows in outbox_rejected: outbox rows a relay could not decode, or the broker refused for good, set aside.")
	descHeldRows     = desc("wmonce_outbox_held_rows", "Rows a relay holds in outbox_held because publishing to their topic fails (the other topics go on); a series per held topic.", "relay", "topic")
	descDelayedRows  = desc("wmonce_outbox_delayed_rows", "Rows a relay set aside in outbox_delayed until their delivery time (_watermill_delayed_until); not in wmonce_outbox_backlog.", "relay")
	descRelayMoved   = desc("wmonce_outbox_position_moved", "1 while the relay's position was recorded on another cluster (a restore or a move, wmonce doctor): it forwards nothing until `wmonce rebase`. Read from the database.", "relay")
	descRelayPaused  = desc("wmonce_outbox_paused", "1 while the relay is paused (outbox.PauseRelay, wmonce pause -relay): it publishes nothing. Read from the database.", "relay")
	descInboxPaused  = desc("wmonce_inbox_paused", "1 while the inbox consumer is paused (inbox.Ops.Pause, wmonce pause -consumer): its processors claim nothing. Read from the database.", "consumer")
	descForwarded    = desc("wmonce_relay_forwarded_total", "Messages published by the outbox relay.", "relay")
	descRelayFail    = desc("wmonce_relay_failures_total", "Failed publish or database attempts of the relay (each retried).", "relay")
	descRelayRej     = desc("wmonce_relay_rejected_total", "Outbox rows this relay set aside in outbox_rejected: undecodable, or refused by the broker for good.", "relay")
	descRelayHeld    = desc("wmonce_relay_held_total", "Outbox rows this relay copied into outbox_held because their topic was failing.", "relay")
	descRelayFenced  = desc("wmonce_relay_fenced_total", "Relay position updates refused because another instance moved the position.", "relay")
	descRelayRecheck = desc("wmonce_relay_rechecks_total", "Short re-reads of an idle relay for transactions in progress when it asked to be notified.", "relay")
	descRelayLeader  = desc("wmonce_relay_leader", "1 while this process holds the relay's leadership.", "relay")
	descJanDeleted   = desc("wmonce_janitor_deleted_total", "Rows deleted by the retention janitor, by table (processed_messages, inbox, outbox, http_idempotency_keys, outbox_rejected, intents).", "table")
	descJanDropped   = desc("wmonce_janitor_partitions_dropped_total", "Days of processed_messages_daily dropped by the retention janitor.")
	descJanRounds    = desc("wmonce_janitor_rounds_total", "Retention rounds run: result=ok or failed (some step failed; see the logs).", "result")
	descJanLeader    = desc("wmonce_janitor_leader", "1 while a janitor of this process leads (deletes) for its schema.")
	descJanLast      = desc("wmonce_janitor_last_round_timestamp_seconds", "Unix time of the last retention round of this process; 0 before the first.")
	descJanWarnings  = desc("wmonce_retention_warnings", "Retention windows shorter than their declared redelivery horizon (see the janitor's start-up log).")
	descScrapeErrors = desc("wmonce_scrape_errors_total", "Database reads that failed during scrapes (source=inbox, outbox, intent or http_idempotency); their gauges are left out of that scrape.", "source")

	descIntentSent       = desc("wmonce_intent_sent_total", "Intents recorded as SENT: the provider confirmed the send, or a reconcile lookup found it.")
	descIntentRetries    = desc("wmonce_intent_retries_total", "Sends the provider answered with NotSent (certainly not performed); the intent went back to PENDING with backoff.")
	descIntentUnknown    = desc("wmonce_intent_unknown_outcomes_total", "Sends whose outcome is unknown (timeout, dropped connection), handed to the channel's crash policy.")
	descIntentParked     = desc("wmonce_intent_parked_total", "Intents parked by senders: status=failed (rejected, or attempts exhausted) or skipped (outcome unknown on a Skip channel).", "status")
	descIntentLeasesExp  = desc("wmonce_intent_leases_expired_total", "Intents found in SENDING after their lease ran out (a sender crashed mid-call, or an unknown outcome waits for reconciliation) and taken back.")
	descIntentReconciled = desc("wmonce_intent_reconciled_total", "Intents in doubt that the provider's lookup confirmed as performed: marked SENT without sending again.")
	descIntentLeaseConfl = desc("wmonce_intent_lease_conflicts_total", "Intent outcomes not recorded because the lease had run out and another sender had taken the intent over.")
	descIntentReleased   = desc("wmonce_intent_released_total", "Intents given back by senders that were stopping (PENDING again, or SENDING with the lease ended).")
	descIntentErrors     = desc("wmonce_intent_sender_errors_total", "Database errors of intent senders (retried).")
	descIntentRows       = desc("wmonce_intent_rows", "Unfinished intents by status (pending, sending, failed, skipped), read from the database.", "channel", "status")
	descIntentRetrying   = desc("wmonce_intent_retrying_rows", "Pending intents a sender took before, waiting out a backoff (part of status=pending).", "channel")
	descIntentOldestAge  = desc("wmonce_intent_oldest_age_seconds", "Age since it was recorded of the oldest intent in status pending or sending, by the database clock; 0 when none. Alert when it grows.", "channel", "status")
	descHTTPRequests     = desc("wmonce_http_idempotency_requests_total", "Requests at the Idempotency-Key middleware: result=stored (ran, response stored with its effects), duplicate (retry answered from the stored response), conflict (409: the key's first request still running), fingerprint_mismatch (422: key reused for a different request), refused (400 or 413: missing or invalid key, unscoped, body too large), failed (handler answered 5xx: rolled back, not stored), error (500: the middleware could not look up, store or commit, or the handler ended the request's transaction), keyless (run without a key under AllowMissingKey; counted in error as well if that then fails).", "result")
	descHTTPEndedTx      = desc("wmonce_http_idempotency_handler_ended_tx_total", "Requests at the Idempotency-Key middleware whose handler called Commit or Rollback on the request's transaction: nothing of them was applied, no key was stored, and they were answered 500 (also counted in wmonce_http_idempotency_requests_total as result=error).")
	descHTTPKeys         = desc("wmonce_http_idempotency_keys", "Stored responses in http_idempotency_keys, live and expired: the planner's estimate (exact while the table has no statistics).")
	descHTTPOldestKey    = desc("wmonce_http_idempotency_oldest_key_age_seconds", "Age of the oldest stored response by the database clock; 0 when none. Well above the middleware's Retention: expired keys are not being deleted.")
)
