package metrics

import (
	"iter"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// The series below come from the components' in-process counts (their Counters()): no query.
// Each component's counters are one list of counter entries: a new count is one entry there
// (and, for a new metric, one desc line in descs.go).

// counter is one count of a component's snapshot: its series, its value and its own last
// label value ("" for none), added after the component's label values.
type counter struct {
	desc  *prometheus.Desc
	value uint64
	label string
}

// addCounters adds a component's counters, each labelled first (the component's label
// values: consumer, relay, ...; nil for none) and then its own label.
func (s *series) addCounters(first []string, cs ...counter) {
	for _, c := range cs {
		labels := first
		if c.label != "" {
			labels = append(slices.Clip(first), c.label)
		}
		s.add(c.desc, prometheus.CounterValue, float64(c.value), labels...)
	}
}

func (c *collector) collectMiddlewares(s *series) {
	if len(c.src.Middlewares) == 0 {
		return
	}
	var groupTx, groupMsgs uint64
	for mw := range present(c.src.Middlewares) {
		counts := mw.Counters()
		for k, n := range counts.Series {
			s.addCounters([]string{k.Consumer, k.Sender},
				counter{descClaims, n.Fresh, "fresh"},
				counter{descClaims, n.Duplicates, "duplicate"},
				counter{descMismatches, n.FingerprintMismatches, ""},
			)
			s.addCounters([]string{k.Consumer},
				counter{descOutcomes, n.Fresh, "applied"},
				counter{descOutcomes, n.Failed, "failed"},
				counter{descOutcomes, n.Refused, "refused"},
				counter{descOutcomes, n.TooOld, "too_old"},
				counter{descOutcomes, n.HandlerEndedTx, "handler_ended_tx"},
				counter{descTxRetries, n.TxRetries, ""},
				counter{descDelayed, n.DelayedRetries, "scheduled"},
				counter{descDelayed, n.DelayedRetriesNacked, "nacked"},
			)
			s.add(descHandlerAcked, prometheus.CounterValue, float64(n.HandlerAcked), "once", k.Consumer)
		}
		groupTx += counts.GroupCommitTransactions
		groupMsgs += counts.GroupCommitMessages
	}
	s.add(descGroupTx, prometheus.CounterValue, float64(groupTx))
	s.add(descGroupMsgs, prometheus.CounterValue, float64(groupMsgs))
}

// present yields the components of a Sources field that are not nil (nil ones are skipped).
func present[C any](components []*C) iter.Seq[*C] {
	return func(yield func(*C) bool) {
		for _, c := range components {
			if c != nil && !yield(c) {
				return
			}
		}
	}
}

func (c *collector) collectInboxComponents(s *series) {
	for r := range present(c.src.Receivers) {
		n := r.Counters()
		s.addCounters([]string{r.Consumer()},
			counter{descReceived, n.Stored, "stored"},
			counter{descReceived, n.Duplicates, "duplicate"},
			counter{descReceived, n.Refused, "refused"},
			counter{descReceived, n.TooOld, "too_old"},
			counter{descRecvBatches, n.Batches, "committed"},
			counter{descRecvBatches, n.BatchFailures, "failed"},
		)
	}
	for p := range present(c.src.Processors) {
		n := p.Counters()
		s.addCounters([]string{p.Consumer()},
			counter{descInboxClaimed, n.Claimed, ""},
			counter{descInboxDone, n.Processed, ""},
			counter{descInboxFailed, n.Failed, ""},
			counter{descInboxParked, n.Parked, ""},
			counter{descLeaseConfl, n.LeaseConflicts, ""},
			counter{descLeaseExp, n.LeasesExpired, ""},
			counter{descReleased, n.Released, ""},
			counter{descInboxErrors, n.Errors, ""},
			counter{descInboxEndedTx, n.HandlerEndedTx, ""},
		)
		s.add(descHandlerAcked, prometheus.CounterValue, float64(n.HandlerAcked), "inbox", p.Consumer())
	}
}

func (c *collector) collectRelays(s *series) {
	for r := range present(c.src.Relays) {
		st := r.Counters()
		s.addCounters([]string{r.Name()},
			counter{descForwarded, st.Forwarded, ""},
			counter{descRelayFail, st.Failures, ""},
			counter{descRelayRej, st.Rejected, ""},
			counter{descRelayHeld, st.Held, ""},
			counter{descRelayFenced, st.Fenced, ""},
			counter{descRelayRecheck, st.Rechecks, ""},
		)
		s.max(descRelayLeader, prometheus.GaugeValue, boolValue(st.IsLeader), r.Name())
	}
}

func (c *collector) collectJanitors(s *series) {
	for j := range present(c.src.Janitors) {
		st := j.Counters()
		s.addCounters(nil,
			counter{descJanDeleted, st.Claims, "processed_messages"},
			counter{descJanDeleted, st.InboxRows, "inbox"},
			counter{descJanDeleted, st.OutboxRows, "outbox"},
			counter{descJanDeleted, st.HTTPKeys, "http_idempotency_keys"},
			counter{descJanDeleted, st.OutboxRejected, "outbox_rejected"},
			counter{descJanDeleted, st.SentIntents, "intents"},
			counter{descJanDropped, st.DailyPartitionsDropped, ""},
			counter{descJanRounds, st.Rounds - st.FailedRounds, "ok"},
			counter{descJanRounds, st.FailedRounds, "failed"},
		)
		s.max(descJanLeader, prometheus.GaugeValue, boolValue(st.IsLeader))
		var last float64
		if !st.LastRound.IsZero() {
			last = float64(st.LastRound.UnixNano()) / 1e9
		}
		s.max(descJanLast, prometheus.GaugeValue, last)
		s.max(descJanWarnings, prometheus.GaugeValue, float64(len(j.Warnings())))
	}
}

// collectSenders sums the Senders' totals: a Sender's counts are not kept per channel (the
// per-channel picture is wmonce_intent_rows).
func (c *collector) collectSenders(s *series) {
	for snd := range present(c.src.Senders) {
		st := snd.Counters()
		s.addCounters(nil,
			counter{descIntentSent, st.Sent, ""},
			counter{descIntentRetries, st.Retried, ""},
			counter{descIntentUnknown, st.Unknown, ""},
			counter{descIntentParked, st.Failed, "failed"},
			counter{descIntentParked, st.Skipped, "skipped"},
			counter{descIntentLeasesExp, st.Recovered, ""},
			counter{descIntentReconciled, st.Reconciled, ""},
			counter{descIntentLeaseConfl, st.LeaseLost, ""},
			counter{descIntentReleased, st.Released, ""},
			counter{descIntentErrors, st.Errors, ""},
		)
	}
}

func (c *collector) collectHTTPIdempotency(s *series) {
	for m := range present(c.src.HTTPIdempotency) {
		st := m.Counters()
		s.addCounters(nil,
			counter{descHTTPRequests, st.Stored, "stored"},
			counter{descHTTPRequests, st.Replayed, "duplicate"},
			counter{descHTTPRequests, st.Conflicts, "conflict"},
			counter{descHTTPRequests, st.Mismatches, "fingerprint_mismatch"},
			counter{descHTTPRequests, st.Refused, "refused"},
			counter{descHTTPRequests, st.NotStored, "failed"},
			counter{descHTTPRequests, st.Failed, "error"},
			counter{descHTTPRequests, st.Keyless, "keyless"},
			counter{descHTTPEndedTx, st.HandlerEndedTx, ""},
		)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
