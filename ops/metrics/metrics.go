package metrics

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// DefaultScrapeTimeout bounds the database queries of one scrape.
const DefaultScrapeTimeout = 5 * time.Second

// Sources are the components whose figures are exported. Nil and empty fields are skipped.
type Sources struct {
	// DB and Schema feed the gauges read from the database at scrape time: inbox rows per
	// status and oldest pending age (every consumer in the inbox table), outbox backlog and lag
	// per relay, rejected outbox rows; with Senders, unfinished intents per channel; with
	// HTTPIdempotency, the stored keys. Nil DB: no database gauges. Schema default
	// pgtx.DefaultSchema.
	DB     *sql.DB
	Schema string
	// ScrapeTimeout bounds those queries. Default 5s.
	ScrapeTimeout time.Duration

	// Middlewares export claims, duplicates, fingerprint mismatches, handler outcomes and
	// transaction retries per consumer (and sender), and group-commit totals.
	Middlewares []*once.Middleware
	// Relays export forwarded, failed, rejected and fenced counts and leadership, labelled
	// with the relay's name when *outbox.Relay has a Name() method (see the package doc).
	Relays []*outbox.Relay
	// Processors export the inbox processors' counts, labelled with the consumer when
	// *inbox.Processor has a Consumer() method.
	Processors []*inbox.Processor
	// Receivers export what the inbox receivers stored, labelled with the consumer when
	// *inbox.Receiver has a Consumer() method.
	Receivers []*inbox.Receiver
	// Janitors export deletions, rounds, leadership and retention warnings.
	Janitors []*retention.Janitor
	// Senders export the intent senders' counts (summed over the Senders) and, with a DB,
	// the unfinished intents per channel of the intents table.
	Senders []*intent.Sender
	// HTTPIdempotency exports the Idempotency-Key middlewares' request outcomes (summed) and,
	// with a DB, the stored keys of http_idempotency_keys.
	HTTPIdempotency []*httpidem.Middleware

	// Logger receives scrape errors. Default: none (they are still counted).
	Logger watermill.LoggerAdapter
}

// Register builds one collector over src and registers it with reg. Counters are read from
// the components' atomic totals and database gauges are queried when reg is gathered, so
// nothing is added to the message path. Register fails if reg already has metrics of these
// names: build a single Sources with every component of the process.
func Register(reg prometheus.Registerer, src Sources) error {
	if reg == nil {
		return errors.New("metrics: registerer is nil: pass prometheus.DefaultRegisterer or a prometheus.NewRegistry()")
	}
	c, err := NewCollector(src)
	if err != nil {
		return err
	}
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("metrics: register: %w", err)
	}
	return nil
}

// NewCollector returns the collector Register registers, for callers that wrap or combine
// collectors themselves.
func NewCollector(src Sources) (prometheus.Collector, error) {
	if src.Schema == "" {
		src.Schema = pgtx.DefaultSchema
	}
	if err := pgtx.ValidateIdentifier("schema", src.Schema); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if src.ScrapeTimeout == 0 {
		src.ScrapeTimeout = DefaultScrapeTimeout
	}
	if src.ScrapeTimeout < 0 {
		return nil, fmt.Errorf("metrics: ScrapeTimeout must not be negative, got %s", src.ScrapeTimeout)
	}
	if src.Logger == nil {
		src.Logger = watermill.NopLogger{}
	}
	c := &collector{src: src, inboxConsumers: map[string]bool{}, intentChannels: map[string]bool{}}
	if src.DB != nil {
		ops, err := inbox.NewOps(src.DB, inbox.OpsConfig{Schema: src.Schema}, src.Logger)
		if err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		c.ops = ops
		if len(src.Senders) > 0 {
			if c.intents, err = intent.NewStore(src.DB, intent.StoreConfig{Schema: src.Schema}); err != nil {
				return nil, fmt.Errorf("metrics: %w", err)
			}
		}
	}
	return c, nil
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	descClaims       = desc("wmonce_claims_total", "Messages the effectively-once middleware claimed: result=fresh (applied and committed) or duplicate (key already claimed, skipped and acked).", "consumer", "sender", "result")
	descMismatches   = desc("wmonce_fingerprint_mismatches_total", "Duplicates whose payload differed from the applied copy's: two different events share one id.", "consumer", "sender")
	descOutcomes     = desc("wmonce_handler_outcomes_total", "Outcomes of messages at the effectively-once middleware: applied (committed), failed (rolled back, redelivered), refused (unusable key or metadata), too_old (refused by the age guard), handler_ended_tx (the handler committed or rolled back the transaction it was lent: nothing applied, a permanent failure).", "consumer", "outcome")
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
	descInboxRows    = desc("wmonce_inbox_rows", "Unfinished inbox rows by status (pending, in_progress, failed), read from the database.", "consumer", "status")
	descRetrying     = desc("wmonce_inbox_retrying_rows", "Pending inbox rows that failed before and wait for another attempt (part of status=pending).", "consumer")
	descOldestAge    = desc("wmonce_inbox_oldest_pending_age_seconds", "Age of the oldest PENDING inbox row by the database clock; 0 when none. Alert when it grows.", "consumer")
	descBacklog      = desc("wmonce_outbox_backlog", "Outbox rows committed after the relay's position: waiting to be published.", "relay")
	descLag          = desc("wmonce_outbox_lag_seconds", "Age of the oldest outbox row the relay has not published yet; 0 when caught up.", "relay")
	descRejected     = desc("wmonce_outbox_rejected", "Rows in outbox_rejected: outbox rows a relay could not decode, or the broker refused for good, set aside.")
	descHeldRows     = desc("wmonce_outbox_held_rows", "Rows a relay holds in outbox_held because publishing to their topic fails (the other topics go on); a series per held topic.", "relay", "topic")
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

var allDescs = []*prometheus.Desc{
	descClaims, descMismatches, descOutcomes, descTxRetries, descGroupTx, descGroupMsgs,
	descReceived, descRecvBatches, descInboxClaimed, descInboxDone, descInboxFailed, descInboxParked,
	descLeaseConfl, descLeaseExp, descReleased, descInboxErrors, descInboxEndedTx, descInboxRows, descRetrying, descOldestAge,
	descBacklog, descLag, descRejected, descHeldRows, descForwarded, descRelayFail, descRelayRej, descRelayHeld, descRelayFenced, descRelayRecheck, descRelayLeader,
	descJanDeleted, descJanDropped, descJanRounds, descJanLeader, descJanLast, descJanWarnings, descScrapeErrors,
	descIntentSent, descIntentRetries, descIntentUnknown, descIntentParked, descIntentLeasesExp, descIntentReconciled,
	descIntentLeaseConfl, descIntentReleased, descIntentErrors, descIntentRows, descIntentRetrying, descIntentOldestAge,
	descHTTPRequests, descHTTPEndedTx, descHTTPKeys, descHTTPOldestKey,
}

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

func (c *collector) collectMiddlewares(s *series) {
	if len(c.src.Middlewares) == 0 {
		return
	}
	var groupTx, groupMsgs uint64
	for _, mw := range c.src.Middlewares {
		if mw == nil {
			continue
		}
		for k, n := range mw.Counters().Series {
			s.add(descClaims, prometheus.CounterValue, float64(n.Fresh), k.Consumer, k.Sender, "fresh")
			s.add(descClaims, prometheus.CounterValue, float64(n.Duplicates), k.Consumer, k.Sender, "duplicate")
			s.add(descMismatches, prometheus.CounterValue, float64(n.FingerprintMismatches), k.Consumer, k.Sender)
			s.add(descOutcomes, prometheus.CounterValue, float64(n.Fresh), k.Consumer, "applied")
			s.add(descOutcomes, prometheus.CounterValue, float64(n.Failed), k.Consumer, "failed")
			s.add(descOutcomes, prometheus.CounterValue, float64(n.Refused), k.Consumer, "refused")
			s.add(descOutcomes, prometheus.CounterValue, float64(n.TooOld), k.Consumer, "too_old")
			s.add(descOutcomes, prometheus.CounterValue, float64(n.HandlerEndedTx), k.Consumer, "handler_ended_tx")
			s.add(descTxRetries, prometheus.CounterValue, float64(n.TxRetries), k.Consumer)
		}
		c := mw.Counters()
		tx, msgs := c.GroupCommitTransactions, c.GroupCommitMessages
		groupTx += tx
		groupMsgs += msgs
	}
	s.add(descGroupTx, prometheus.CounterValue, float64(groupTx))
	s.add(descGroupMsgs, prometheus.CounterValue, float64(groupMsgs))
}

// The label of a component comes from an accessor when its type has one. Keeping this an
// optional interface lets the metrics follow those packages without a change here.
type namedRelay interface{ Name() string }
type consumerNamed interface{ Consumer() string }

func consumerOf(v any) string {
	if n, ok := v.(consumerNamed); ok {
		return n.Consumer()
	}
	return ""
}

func (c *collector) collectInboxComponents(s *series) {
	for _, r := range c.src.Receivers {
		if r == nil {
			continue
		}
		consumer := consumerOf(r)
		n := r.Counters()
		s.add(descReceived, prometheus.CounterValue, float64(n.Stored), consumer, "stored")
		s.add(descReceived, prometheus.CounterValue, float64(n.Duplicates), consumer, "duplicate")
		s.add(descReceived, prometheus.CounterValue, float64(n.Refused), consumer, "refused")
		s.add(descReceived, prometheus.CounterValue, float64(n.TooOld), consumer, "too_old")
		s.add(descRecvBatches, prometheus.CounterValue, float64(n.Batches), consumer, "committed")
		s.add(descRecvBatches, prometheus.CounterValue, float64(n.BatchFailures), consumer, "failed")
	}
	for _, p := range c.src.Processors {
		if p == nil {
			continue
		}
		consumer := consumerOf(p)
		n := p.Counters()
		s.add(descInboxClaimed, prometheus.CounterValue, float64(n.Claimed), consumer)
		s.add(descInboxDone, prometheus.CounterValue, float64(n.Processed), consumer)
		s.add(descInboxFailed, prometheus.CounterValue, float64(n.Failed), consumer)
		s.add(descInboxParked, prometheus.CounterValue, float64(n.Parked), consumer)
		s.add(descLeaseConfl, prometheus.CounterValue, float64(n.LeaseConflicts), consumer)
		s.add(descLeaseExp, prometheus.CounterValue, float64(n.LeasesExpired), consumer)
		s.add(descReleased, prometheus.CounterValue, float64(n.Released), consumer)
		s.add(descInboxErrors, prometheus.CounterValue, float64(n.Errors), consumer)
		s.add(descInboxEndedTx, prometheus.CounterValue, float64(n.HandlerEndedTx), consumer)
	}
}

func (c *collector) collectRelays(s *series) {
	for _, r := range c.src.Relays {
		if r == nil {
			continue
		}
		var name string
		if n, ok := any(r).(namedRelay); ok {
			name = n.Name()
		}
		st := r.Counters()
		s.add(descForwarded, prometheus.CounterValue, float64(st.Forwarded), name)
		s.add(descRelayFail, prometheus.CounterValue, float64(st.Failures), name)
		s.add(descRelayRej, prometheus.CounterValue, float64(st.Rejected), name)
		s.add(descRelayHeld, prometheus.CounterValue, float64(st.Held), name)
		s.add(descRelayFenced, prometheus.CounterValue, float64(st.Fenced), name)
		s.add(descRelayRecheck, prometheus.CounterValue, float64(st.Rechecks), name)
		s.max(descRelayLeader, prometheus.GaugeValue, boolValue(st.IsLeader), name)
	}
}

func (c *collector) collectJanitors(s *series) {
	if len(c.src.Janitors) == 0 {
		return
	}
	for _, j := range c.src.Janitors {
		if j == nil {
			continue
		}
		st := j.Counters()
		s.add(descJanDeleted, prometheus.CounterValue, float64(st.Claims), "processed_messages")
		s.add(descJanDeleted, prometheus.CounterValue, float64(st.InboxRows), "inbox")
		s.add(descJanDeleted, prometheus.CounterValue, float64(st.OutboxRows), "outbox")
		s.add(descJanDeleted, prometheus.CounterValue, float64(st.HTTPKeys), "http_idempotency_keys")
		s.add(descJanDeleted, prometheus.CounterValue, float64(st.OutboxRejected), "outbox_rejected")
		s.add(descJanDeleted, prometheus.CounterValue, float64(st.SentIntents), "intents")
		s.add(descJanDropped, prometheus.CounterValue, float64(st.DailyPartitionsDropped))
		s.add(descJanRounds, prometheus.CounterValue, float64(st.Rounds-st.FailedRounds), "ok")
		s.add(descJanRounds, prometheus.CounterValue, float64(st.FailedRounds), "failed")
		s.max(descJanLeader, prometheus.GaugeValue, boolValue(st.IsLeader))
		var last float64
		if !st.LastRound.IsZero() {
			last = float64(st.LastRound.UnixNano()) / 1e9
		}
		s.max(descJanLast, prometheus.GaugeValue, last)
		s.max(descJanWarnings, prometheus.GaugeValue, float64(len(j.Warnings())))
	}
}

func (c *collector) collectInboxRows(ctx context.Context, s *series) {
	stats, err := c.ops.AllStats(ctx)
	if err != nil {
		c.readFailed(&c.inboxErrors, "Metrics: could not read inbox stats; inbox gauges left out of this scrape", err)
		return
	}
	var working []string
	for _, p := range c.src.Processors {
		if p == nil {
			continue
		}
		if consumer := consumerOf(p); consumer != "" {
			working = append(working, consumer)
		}
	}
	for _, consumer := range c.remember(c.inboxConsumers, maps.Keys(stats), slices.Values(working)) {
		st := stats[consumer]
		s.add(descInboxRows, prometheus.GaugeValue, float64(st.Pending), consumer, "pending")
		s.add(descInboxRows, prometheus.GaugeValue, float64(st.InProgress), consumer, "in_progress")
		s.add(descInboxRows, prometheus.GaugeValue, float64(st.Failed), consumer, "failed")
		s.add(descRetrying, prometheus.GaugeValue, float64(st.Retrying), consumer)
		s.add(descOldestAge, prometheus.GaugeValue, st.OldestPendingAge.Seconds(), consumer)
	}
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

func (c *collector) collectOutbox(ctx context.Context, s *series) {
	relays, rejected, err := outbox.Stats(ctx, c.src.DB, c.src.Schema)
	if err != nil {
		c.readFailed(&c.outboxErrors, "Metrics: could not read outbox status; outbox gauges left out of this scrape", err)
		return
	}
	for _, r := range relays {
		s.add(descBacklog, prometheus.GaugeValue, float64(r.Backlog), r.Name)
		s.add(descLag, prometheus.GaugeValue, r.Lag.Seconds(), r.Name)
		for _, h := range r.Held {
			s.add(descHeldRows, prometheus.GaugeValue, float64(h.Rows), r.Name, h.Topic)
		}
	}
	s.add(descRejected, prometheus.GaugeValue, float64(rejected))
}

// collectSenders sums the Senders' totals: a Sender's counts are not kept per channel (the
// per-channel picture is wmonce_intent_rows).
func (c *collector) collectSenders(s *series) {
	if len(c.src.Senders) == 0 {
		return
	}
	for _, snd := range c.src.Senders {
		if snd == nil {
			continue
		}
		st := snd.Counters()
		s.add(descIntentSent, prometheus.CounterValue, float64(st.Sent))
		s.add(descIntentRetries, prometheus.CounterValue, float64(st.Retried))
		s.add(descIntentUnknown, prometheus.CounterValue, float64(st.Unknown))
		s.add(descIntentParked, prometheus.CounterValue, float64(st.Failed), "failed")
		s.add(descIntentParked, prometheus.CounterValue, float64(st.Skipped), "skipped")
		s.add(descIntentLeasesExp, prometheus.CounterValue, float64(st.Recovered))
		s.add(descIntentReconciled, prometheus.CounterValue, float64(st.Reconciled))
		s.add(descIntentLeaseConfl, prometheus.CounterValue, float64(st.LeaseLost))
		s.add(descIntentReleased, prometheus.CounterValue, float64(st.Released))
		s.add(descIntentErrors, prometheus.CounterValue, float64(st.Errors))
	}
}

func (c *collector) collectHTTPIdempotency(s *series) {
	for _, m := range c.src.HTTPIdempotency {
		if m == nil {
			continue
		}
		st := m.Counters()
		s.add(descHTTPRequests, prometheus.CounterValue, float64(st.Stored), "stored")
		s.add(descHTTPRequests, prometheus.CounterValue, float64(st.Replayed), "duplicate")
		s.add(descHTTPRequests, prometheus.CounterValue, float64(st.Conflicts), "conflict")
		s.add(descHTTPRequests, prometheus.CounterValue, float64(st.Mismatches), "fingerprint_mismatch")
		s.add(descHTTPRequests, prometheus.CounterValue, float64(st.Refused), "refused")
		s.add(descHTTPRequests, prometheus.CounterValue, float64(st.NotStored), "failed")
		s.add(descHTTPRequests, prometheus.CounterValue, float64(st.Failed), "error")
		s.add(descHTTPRequests, prometheus.CounterValue, float64(st.Keyless), "keyless")
		s.add(descHTTPEndedTx, prometheus.CounterValue, float64(st.HandlerEndedTx))
	}
}

func (c *collector) collectIntentRows(ctx context.Context, s *series) {
	backlog, err := c.intents.Backlog(ctx)
	if err != nil {
		c.readFailed(&c.intentErrors, "Metrics: could not read the intent backlog; intent gauges left out of this scrape", err)
		return
	}
	var working []string
	for _, snd := range c.src.Senders {
		if snd != nil {
			working = append(working, snd.Channels()...)
		}
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

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// series collects one scrape's samples, merging those with equal name and labels (several
// middlewares serving one consumer, relays without a name) so that each is sent once:
// counters and gauges of amounts are summed, flags and timestamps take the maximum.
type series struct {
	values map[string]*sample
	order  []string
}

type sample struct {
	desc   *prometheus.Desc
	typ    prometheus.ValueType
	labels []string
	value  float64
}

func newSeries() *series { return &series{values: map[string]*sample{}} }

func (s *series) get(d *prometheus.Desc, typ prometheus.ValueType, labels []string) (*sample, bool) {
	// Label values come partly from message metadata (the sender): invalid UTF-8 there must
	// not make the scrape fail.
	for i, l := range labels {
		labels[i] = strings.ToValidUTF8(l, "\uFFFD")
	}
	key := d.String() + "\xff" + strings.Join(labels, "\xff")
	if v, ok := s.values[key]; ok {
		return v, true
	}
	v := &sample{desc: d, typ: typ, labels: slices.Clone(labels)}
	s.values[key] = v
	s.order = append(s.order, key)
	return v, false
}

func (s *series) add(d *prometheus.Desc, typ prometheus.ValueType, v float64, labels ...string) {
	smp, _ := s.get(d, typ, labels)
	smp.value += v
}

func (s *series) max(d *prometheus.Desc, typ prometheus.ValueType, v float64, labels ...string) {
	smp, existed := s.get(d, typ, labels)
	if !existed || v > smp.value {
		smp.value = v
	}
}

func (s *series) flush(ch chan<- prometheus.Metric) {
	for _, key := range s.order {
		v := s.values[key]
		m, err := prometheus.NewConstMetric(v.desc, v.typ, v.value, v.labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(v.desc, err) // a bug here: reported by Gather, never a panic
		}
		ch <- m
	}
}
