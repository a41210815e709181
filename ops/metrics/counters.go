package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The series below come from the components' in-process counts (their Counters()): no query.

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
			s.add(descClaims, prometheus.CounterValue, float64(n.Fresh), k.Consumer, k.Sender, "fresh")
			s.add(descClaims, prometheus.CounterValue, float64(n.Duplicates), k.Consumer, k.Sender, "duplicate")
			s.add(descMismatches, prometheus.CounterValue, float64(n.FingerprintMismatches), k.Consumer, k.Sender)
			s.add(descOutcomes, prometheus.CounterValue, float64(n.Fresh), k.Consumer, "applied")
			s.add(descOutcomes, prometheus.CounterValue, float64(n.Failed), k.Consumer, "failed")
			s.add(descOutcomes, prometheus.CounterValue, float64(n.Refused), k.Consumer, "refused")
			s.add(descOutcomes, prometheus.CounterValue, float64(n.TooOld), k.Consumer, "too_old")
			s.add(descOutcomes, prometheus.CounterValue, float64(n.HandlerEndedTx), k.Consumer, "handler_ended_tx")
			s.add(descTxRetries, prometheus.CounterValue, float64(n.TxRetries), k.Consumer)
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

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
