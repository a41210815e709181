package once

import (
	"context"
	"database/sql"
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/txguard"
)

// endedSubscriberTxs remembers, on watermill-sql's subscriber path, the transactions that a
// handler ended (Commit or Rollback on the transaction it was lent) and the message whose
// handler did it.
//
// The attempt guard refuses such a COMMIT, so the server rolls the subscriber's transaction
// back with everything in it, and the message is a permanent failure: the Stack parks it (in a
// transaction of its own) and the router acks it. But an ack into an ended transaction cannot
// move the consumer offset: the subscriber's own statements fail, it rolls back and delivers the
// message again in a new transaction, where the handler would end it again and the message would
// be parked again, forever. So the middleware remembers the parked copy: a later delivery of the
// same key, after that copy was acked, is acked without running the handler, and the offset
// moves with it. If the copy was nacked instead (nothing parked it), the message runs again.
//
// Other messages the subscriber delivers into the ended transaction (the rest of its batch) are
// acked into it without running: nothing of that transaction can commit, so the subscriber
// delivers them again in a new one, as for a doomed transaction.
//
// The memory is per process and bounded: after a restart a parked message may be parked once
// more (parking is at-least-once), never applied.
type endedSubscriberTxs struct {
	mu    sync.Mutex
	byTx  map[*sql.Tx]claimKey
	byKey map[claimKey]*message.Message
	order []claimKey // oldest first, for the bound
}

type claimKey struct{ consumer, key string }

// maxEndedSubscriberTxs bounds the memory: one entry per parked message not yet redelivered.
const maxEndedSubscriberTxs = 1024

// ended records that d's handler ended tx; d.msg is the delivery whose outcome decides.
func (m *endedSubscriberTxs) ended(tx *sql.Tx, d *delivery) {
	k := claimKey{d.consumer, d.key}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byTx == nil {
		m.byTx, m.byKey = map[*sql.Tx]claimKey{}, map[claimKey]*message.Message{}
	}
	if _, ok := m.byKey[k]; !ok {
		m.order = append(m.order, k)
	}
	m.byTx[tx], m.byKey[k] = k, d.msg
	for len(m.order) > maxEndedSubscriberTxs {
		old := m.order[0]
		m.order = m.order[1:]
		delete(m.byKey, old)
		for t, tk := range m.byTx {
			if tk == old {
				delete(m.byTx, t)
			}
		}
	}
}

// endedBy returns the key whose handler ended tx, if one did.
func (m *endedSubscriberTxs) endedBy(tx *sql.Tx) (claimKey, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k, ok := m.byTx[tx]
	return k, ok
}

// settledEarlier reports whether an earlier copy of d's key ended its subscriber transaction and
// was then acked (parked). It forgets the copy either way once its outcome is known.
func (m *endedSubscriberTxs) settledEarlier(d *delivery) bool {
	k := claimKey{d.consumer, d.key}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, ok := m.byKey[k]
	if !ok || prev == d.msg {
		return false
	}
	acked := false
	select {
	case <-prev.Acked():
		acked = true
	case <-prev.Nacked():
	default:
		return false // still in flight (a copy delivered twice at once): decide normally
	}
	delete(m.byKey, k)
	for t, tk := range m.byTx {
		if tk == k {
			delete(m.byTx, t)
		}
	}
	return acked
}

// subscriberTxEnded settles a delivery whose subscriber transaction was already ended when its
// claim was sent (err is that claim's sql.ErrTxDone).
func (e *Middleware) subscriberTxEnded(ctx context.Context, d *delivery, tx *sql.Tx, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx) // the subscriber's context ended: nobody's fault
	}
	if k, ok := e.ended.endedBy(tx); ok && k == (claimKey{d.consumer, d.key}) {
		// This message's own handler ended it, and the copy was not parked (nacked): it is
		// still the message's permanent failure.
		return e.handlerEndedTx(d, txguard.Ended(err))
	}
	d.counters.txRetries.Add(1)
	e.logger.Info("Subscriber transaction already ended (an earlier message's handler ended it); acked into it without running, the message will be redelivered in a new one", d.fields)
	return nil
}

// isEnded reports a txguard error of a handler that ended its transaction.
func isEnded(err error) bool { return errors.Is(err, wmonce.ErrHandlerEndedTx) }
