package metrics

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// The series below come from the components' in-process counts (their Counters()): no query.

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
	for _, mw := range c.src.Middlewares {
		if mw == nil {
			continue
		}
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
		s.addCounters([]string{consumer},
			counter{descReceived, n.Stored, "stored"},
			counter{descReceived, n.Duplicates, "duplicate"},
			counter{descReceived, n.Refused, "refused"},
			counter{descReceived, n.TooOld, "too_old"},
			counter{descRecvBatches, n.Batches, "committed"},
			counter{descRecvBatches, n.BatchFailures, "failed"},
		)
	}
	for _, p := range c.src.Processors {
		if p == nil {
			continue
		}
		consumer := consumerOf(p)
		n := p.Counters()
		s.addCounters([]string{consumer},
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
		s.add(descHandlerAcked, prometheus.CounterValue, float64(n.HandlerAcked), "inbox", consumer)
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
		s.addCounters([]string{name},
			counter{descForwarded, st.Forwarded, ""},
			counter{descRelayFail, st.Failures, ""},
			counter{descRelayRej, st.Rejected, ""},
			counter{descRelayHeld, st.Held, ""},
			counter{descRelayFenced, st.Fenced, ""},
			counter{descRelayRecheck, st.Rechecks, ""},
		)
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
	if len(c.src.Senders) == 0 {
		return
	}
	for _, snd := range c.src.Senders {
		if snd == nil {
			continue
		}
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
	for _, m := range c.src.HTTPIdempotency {
		if m == nil {
			continue
		}
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
