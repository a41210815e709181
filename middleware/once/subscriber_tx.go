package once

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// runInSubscriberTx works inside the transaction watermill-sql's subscriber consumes in, so the
// consumer offset, the claim and the effects commit together (the subscriber commits on ack).
// Each attempt runs in a savepoint: the subscriber re-delivers a nacked message in the same
// transaction without rolling back, so a failed attempt must undo itself. Per message this costs
// one round trip besides the handler's (savepoint, guard and claim together; the release travels
// with the next statement), plus one to compare the payload of a duplicate.
func (e *Middleware) runInSubscriberTx(ctx context.Context, h message.HandlerFunc, d *delivery, tx *sql.Tx) error {
	if e.ended.settledEarlier(d) {
		e.logger.Info("Redelivery of a message whose handler ended the subscriber's transaction and that was parked: acked without running", d.logFields())
		return nil
	}
	args := []any{pgx.QueryExecModeSimpleProtocol, d.consumer, d.key, d.fingerprint}
	if e.q.daily {
		args = append(args, partition.Day(d.occurredAt).Format(time.DateOnly))
	}
	res, err := tx.ExecContext(ctx, e.q.savepointClaim, args...)
	if settled, err := e.subscriberTxUnusable(ctx, d, tx, err); settled {
		return err
	}
	rollback := func(cause error) error { return e.rollbackAttempt(ctx, d, tx, cause) }
	fresh, err := e.claimOutcome(ctx, tx, d, res, err)
	var lost *claimedAfterSnapshotError
	if errors.As(err, &lost) {
		return e.duplicateAfterSnapshot(ctx, d, tx, lost, rollback)
	}
	if err != nil {
		err = rollback(err)
		e.ensurePartition(ctx, err) // the redelivery will find it
		return err
	}
	if !fresh {
		return rollback(nil)
	}
	if err := e.apply(ctx, h, d, tx); err != nil {
		if pgtx.IsSerializationFailure(err) && !wmonce.IsPermanent(err) {
			return e.abandonSnapshot(ctx, d, tx, err, rollback)
		}
		return rollback(err)
	}
	if _, err := tx.ExecContext(ctx, e.q.savepointRelease); err != nil {
		if txguard.IsEnded(ctx, err) {
			// attempt_close (migration 017) found the transaction gone: the handler ended it
			// with SQL text the subscriber's pool does not see.
			return rollback(e.handlerEndedTx(d, txguard.Ended(err)))
		}
		return rollback(fmt.Errorf("once: release savepoint: %w", err))
	}
	d.attemptComplete()
	// Counted when the attempt is complete: the subscriber's commit comes later and cannot be
	// observed from here. If that commit fails, the message is redelivered and counted again.
	d.counters.fresh.Add(1)
	return nil
}

// subscriberTxUnusable settles a delivery whose claim statement (its error err) found the
// subscriber's transaction unable to take it: ended, its connection lost, or doomed.
func (e *Middleware) subscriberTxUnusable(ctx context.Context, d *delivery, tx *sql.Tx, err error) (settled bool, _ error) {
	if errors.Is(err, sql.ErrTxDone) {
		return true, e.subscriberTxEnded(ctx, d, tx, err)
	}
	if lostConnection(ctx, err) {
		return true, e.subscriberTxLost(d, err)
	}
	code := pgtx.SQLState(err)
	if code != codeAttemptRefused && code != pgtx.CodeInFailedTransaction {
		return false, nil
	}
	// An earlier attempt doomed this transaction (see abandonSnapshot): nothing in it can
	// commit, and the subscriber delivers this message again in a new one. Leave the savepoint
	// (attempt_begin refused inside it) so that the transaction stays usable until its COMMIT
	// fails.
	if code == codeAttemptRefused {
		_, _ = tx.ExecContext(context.WithoutCancel(ctx), spRollback)
	}
	d.counters.txRetries.Add(1)
	e.logger.Info("Subscriber transaction cannot commit; the message will be redelivered in a new one", d.logFields())
	return true, nil
}

// rollbackAttempt undoes an attempt in the subscriber's transaction (rolls back to its
// savepoint) and returns cause, joined with the rollback's error if it failed.
func (e *Middleware) rollbackAttempt(ctx context.Context, d *delivery, tx *sql.Tx, cause error) error {
	if isEnded(cause) {
		// The handler ended the subscriber's transaction: nothing is left to roll back, and its
		// redelivery in a new transaction must not run it again (endedSubscriberTxs).
		e.ended.ended(tx, d)
		return cause
	}
	if _, err := tx.ExecContext(context.WithoutCancel(ctx), spRollback); err != nil {
		// Only the subscriber's own statement proves its transaction dead: the cause may come
		// from another connection the handler uses.
		if lostConnection(ctx, err) {
			return e.subscriberTxLost(d, errors.Join(cause, err))
		}
		return errors.Join(cause, fmt.Errorf("once: rollback to savepoint: %w", err))
	}
	return cause
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
	e.logger.Info("Subscriber transaction already ended (an earlier message's handler ended it); acked into it without running, the message will be redelivered in a new one", d.logFields())
	return nil
}

// lostConnection reports an error of a statement in the subscriber's transaction that says its
// connection is gone (a terminated backend, a network failure, database/sql's bad connection)
// while the delivery's context is alive: that transaction can never commit.
func lostConnection(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && (errors.Is(err, driver.ErrBadConn) || pgtx.IsConnectionError(err))
}

// subscriberTxLost settles a delivery whose subscriber transaction lost its connection. A nack
// would make watermill-sql send the message again in the same dead transaction, failing each
// time until AckDeadline (30 s by default) while the subscription stalls. Acked instead, as for
// a doomed transaction (abandonSnapshot): nothing of it was applied, the subscriber's offset
// update and COMMIT fail on the dead connection, and it rolls back and reads the message again
// in a new transaction at once.
func (e *Middleware) subscriberTxLost(d *delivery, err error) error {
	d.counters.txRetries.Add(1)
	e.logger.Info("Subscriber transaction lost its connection: acked into it without effect, so that the subscriber rolls back and delivers the message again in a new one",
		d.logFields().Add(watermill.LogFields{"err": err.Error()}))
	return nil
}

// claimedAfterSnapshotError is a serialization failure (40001) of the claim statement itself.
// Under REPEATABLE READ, INSERT ... ON CONFLICT DO NOTHING fails so only when the conflicting
// row is live and committed but invisible to the transaction's snapshot (PostgreSQL waits for
// an inserter still in progress, and a row whose inserter aborted, or whose deletion committed,
// is no conflict): a claim for the key was committed after the snapshot was taken. Under
// SERIALIZABLE the same SQLSTATE can also be an SSI conflict, which proves nothing, so the
// committed claim is looked up before the copy is called a duplicate.
type claimedAfterSnapshotError struct{ err error }

func (e *claimedAfterSnapshotError) Error() string {
	return "once: claim: serialization failure (a copy committed its claim after this transaction's snapshot?): " + e.err.Error()
}

func (e *claimedAfterSnapshotError) Unwrap() error { return e.err }

// duplicateAfterSnapshot settles a copy whose claim failed with 40001 in the subscriber's
// transaction. Retrying in place cannot help: rolling back to the savepoint keeps the snapshot,
// so every retry meets the same invisible row until AckDeadline, while the open transaction
// holds back every SQL subscriber and relay on the server. The committed claim is read on a
// connection of its own (it is invisible to the snapshot), bounded by duplicateLookupTimeout.
// Found: the copy is a duplicate like any other, counted, compared and acked. Not found, or not
// readable in time (the pool may have no connection to spare): nothing proves the duplicate, so
// the transaction is given up (abandonSnapshot) and the message redelivered in a new one,
// where the claim decides as usual.
func (e *Middleware) duplicateAfterSnapshot(ctx context.Context, d *delivery, tx *sql.Tx, lost *claimedAfterSnapshotError, rollback func(error) error) error {
	args := []any{d.consumer, d.key}
	if e.q.daily {
		args = append(args, partition.Day(d.occurredAt))
	}
	lctx, cancel := context.WithTimeout(ctx, duplicateLookupTimeout)
	defer cancel()
	var stored []byte
	var processedAt time.Time
	if err := e.db.QueryRowContext(lctx, e.q.lookup, args...).Scan(&stored, &processedAt); err != nil {
		if !errors.Is(err, sql.ErrNoRows) {
			e.logger.Error("Could not read the claim that a copy lost to", err, d.logFields())
		}
		return e.abandonSnapshot(ctx, d, tx, lost, rollback)
	}
	if err := rollback(nil); err != nil {
		return errors.Join(lost, err)
	}
	d.countDuplicate()
	return e.reportDuplicate(d, stored, processedAt)
}

// duplicateLookupTimeout bounds the lookup of the committed claim in duplicateAfterSnapshot.
const duplicateLookupTimeout = time.Second

// abandonSnapshot handles a serialization failure of the handler in the subscriber's
// transaction. Re-running the attempt in place cannot succeed: rolling back to the savepoint
// keeps the REPEATABLE READ snapshot, so a nack would be re-sent and fail again until
// AckDeadline, while the open transaction holds back every SQL subscriber and relay. Instead
// the attempt is undone and the transaction doomed (a guard row stays, which fails its COMMIT),
// and the message is acked into it: the subscriber's commit fails, its offset does not move, and
// it delivers the message again in a new transaction with a fresh snapshot. Nothing of the
// attempt, nor of any later message in the same transaction, can commit.
func (e *Middleware) abandonSnapshot(ctx context.Context, d *delivery, tx *sql.Tx, cause error, rollback func(error) error) error {
	if _, err := tx.ExecContext(context.WithoutCancel(ctx), e.q.doom); err != nil {
		return rollback(errors.Join(cause, fmt.Errorf("once: doom subscriber transaction: %w", err)))
	}
	d.counters.txRetries.Add(1)
	e.logger.Info("Serialization failure in the subscriber's transaction: it will not commit, and the message is redelivered in a new one",
		d.logFields().Add(watermill.LogFields{"err": cause.Error()}))
	return nil
}

// attemptComplete records, on the subscriber-transaction path, that the attempt is done: the
// COMMIT is the subscriber's, after the ack, and is not traced.
func (d *delivery) attemptComplete() {
	if d.recording {
		d.span.AddEvent("attempt complete: the subscriber commits it with its offset on ack")
	}
}

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
