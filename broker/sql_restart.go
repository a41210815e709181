package broker

import (
	"context"
	"database/sql"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// A new transaction when the subscription's one can no longer commit.
//
// watermill-sql delivers a batch inside one transaction and, when a message is nacked, sends it
// again in the same transaction until it is acked or AckDeadline (30 s by default) passes. When
// that transaction can no longer commit, every further attempt is wasted and the subscription
// stalls for the rest of AckDeadline: its connection was lost (a terminated backend, a network
// failure, a server restart), it was ended under the subscriber (sql.ErrTxDone), or a statement
// failed outside a savepoint and PostgreSQL aborted it (25P02). So after every nack the
// subscription asks the transaction for one statement; if it cannot run one, the subscription
// ends that run of watermill-sql's consume loop (its context is cancelled, which makes
// database/sql roll the transaction back) and starts another, which reads the batch again in a
// new transaction from the group's committed offset.
//
// Nothing is acked that was not applied: the offset of the batch is written in the transaction
// that is rolled back, so every message of the batch, those acked before the nack included, is
// delivered again, and what their handlers wrote in that transaction is gone with it (with the
// effectively-once middleware in a transaction of its own, their claims make the redeliveries
// duplicates). Consecutive restarts without an ack in between wait NackDelay, doubling up
// to maxRestartBackoff, so a handler that fails the same way every time does not spin.

// maxRestartBackoff caps the wait between consecutive restarts of a subscription without an
// ack in between.
const maxRestartBackoff = 5 * time.Second

// txProbeTimeout bounds the statement that checks the transaction after a nack. A connection
// that does not answer in time is given up like a dead one: the probe's cancellation breaks it.
const txProbeTimeout = 5 * time.Second

// sqlRun is one run of watermill-sql's consume loop for a subscription.
type sqlRun struct {
	in   <-chan *message.Message
	stop context.CancelFunc
}

// startRun starts a run of watermill-sql's consume loop on sub, unless the subscriber is
// closed. The lock orders it against Close: watermill-sql's Subscribe and Close are not safe
// to call at the same time.
func (s *sqlSubscriber) startRun(ctx context.Context, sub message.Subscriber, topic string) (sqlRun, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return sqlRun{}, s.s.wm.errSubscriberClosed()
	}
	return s.startRunLocked(ctx, sub, topic)
}

func (s *sqlSubscriber) startRunLocked(ctx context.Context, sub message.Subscriber, topic string) (sqlRun, error) {
	runCtx, stop := context.WithCancel(ctx)
	in, err := sub.Subscribe(runCtx, topic)
	if err != nil {
		stop()
		return sqlRun{}, err
	}
	return sqlRun{in: in, stop: stop}, nil
}

// forward hands the messages of the current run to out, and starts a new run when a nacked
// message's transaction can no longer commit. It closes out when the subscription ends
// (Close, or ctx).
func (s *sqlSubscriber) forward(ctx context.Context, sub message.Subscriber, topic string, w *sqlWaiter, run sqlRun, out chan<- *message.Message) {
	defer close(out)
	defer func() { run.stop() }()
	logger := s.logger.With(watermill.LogFields{"topic": topic, "consumer_group": s.group})
	backoff := worker.Backoff{Base: s.s.config.NackDelay, Max: max(s.s.config.NackDelay, maxRestartBackoff)}
	for {
		msg, ok := <-run.in // not range: a restart replaces run
		if !ok {
			return
		}
		// Either version's: v4's is a *sql.Tx too, in a StdSQLTx.
		tx, _ := pgtx.SubscriberTxFromContext(msg.Context())
		if !s.handOver(ctx, msg, out) || !s.nacked(ctx, msg, &backoff) || tx == nil {
			continue
		}
		err := probeTx(ctx, tx)
		if err == nil || ended(ctx, s.closing) {
			continue
		}
		wait := backoff.Next()
		logger.Error("SQL broker subscription's transaction cannot commit (connection lost, transaction ended or aborted); reading its batch again in a new one", err,
			watermill.LogFields{"msg_uuid": msg.UUID, "wait": wait})
		if run, ok = s.restartRun(ctx, sub, topic, w, run, wait); !ok {
			return
		}
	}
}

// handOver sends msg to out; false, with msg nacked, when the subscription ends first (the
// run's channel is drained until watermill-sql closes it).
func (s *sqlSubscriber) handOver(ctx context.Context, msg *message.Message, out chan<- *message.Message) bool {
	select {
	case out <- msg:
		return true
	case <-s.closing:
	case <-ctx.Done():
	}
	msg.Nack()
	return false
}

// nacked waits for msg's ack or nack and reports a nack; an ack resets backoff, and the
// subscription's end reports false.
func (s *sqlSubscriber) nacked(ctx context.Context, msg *message.Message, backoff *worker.Backoff) bool {
	select {
	case <-msg.Acked():
		backoff.Reset()
		return false
	case <-msg.Nacked():
		return true
	case <-s.closing:
		return false
	case <-ctx.Done():
		return false
	}
}

// restartRun stops old, nacks what it still delivers, and after wait starts a new run; false
// (with old) when the subscription ends meanwhile.
func (s *sqlSubscriber) restartRun(ctx context.Context, sub message.Subscriber, topic string, w *sqlWaiter, old sqlRun, wait time.Duration) (sqlRun, bool) {
	old.stop()
	if w != nil {
		w.requeryNow() // the old run may be waiting for a notification
	}
	go func() {
		for m := range old.in { // nothing of it can commit any more
			m.Nack()
		}
	}()
	if !s.sleep(ctx, wait) {
		return old, false
	}
	next, err := s.startRun(ctx, sub, topic)
	if err != nil {
		return old, false // closed meanwhile
	}
	return next, true
}

// probeTx runs one statement in tx. It fails when the transaction can never commit: its
// connection is gone, it was ended (sql.ErrTxDone) or PostgreSQL aborted it (25P02).
func probeTx(ctx context.Context, tx *sql.Tx) error {
	ctx, cancel := context.WithTimeout(ctx, txProbeTimeout)
	defer cancel()
	_, err := tx.ExecContext(ctx, `SELECT 1`)
	return err
}

// sleep waits d, or reports false as soon as the subscription ends.
func (s *sqlSubscriber) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.closing:
		return false
	case <-ctx.Done():
		return false
	}
}
