package once

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
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
		e.logger.Info("Redelivery of a message whose handler ended the subscriber's transaction and that was parked: acked without running", d.fields)
		return nil
	}
	args := []any{pgx.QueryExecModeSimpleProtocol, d.consumer, d.key, d.fingerprint}
	if e.q.daily {
		args = append(args, partition.Day(d.occurredAt).Format(time.DateOnly))
	}
	res, err := tx.ExecContext(ctx, e.q.savepointClaim, args...)
	if errors.Is(err, sql.ErrTxDone) {
		return e.subscriberTxEnded(ctx, d, tx, err)
	}
	if lostConnection(ctx, err) {
		return e.subscriberTxLost(d, err)
	}
	if code := pgtx.SQLState(err); code == codeAttemptRefused || code == pgtx.CodeInFailedTransaction {
		// An earlier attempt doomed this transaction (see abandonSnapshot): nothing in it
		// can commit, and the subscriber delivers this message again in a new one. Leave
		// the savepoint (attempt_begin refused inside it) so that the transaction stays usable
		// until its COMMIT fails.
		if code == codeAttemptRefused {
			_, _ = tx.ExecContext(context.WithoutCancel(ctx), spRollback)
		}
		d.counters.txRetries.Add(1)
		e.logger.Info("Subscriber transaction cannot commit; the message will be redelivered in a new one", d.fields)
		return nil
	}
	rollback := func(cause error) error {
		if isEnded(cause) {
			// The handler ended the subscriber's transaction: nothing is left to roll back, and
			// its redelivery in a new transaction must not run it again (subscriber_ended.go).
			e.ended.ended(tx, d)
			return cause
		}
		if _, err := tx.ExecContext(context.WithoutCancel(ctx), spRollback); err != nil {
			// Only the subscriber's own statement proves its transaction dead: the cause may
			// come from another connection the handler uses.
			if lostConnection(ctx, err) {
				return e.subscriberTxLost(d, errors.Join(cause, err))
			}
			return errors.Join(cause, fmt.Errorf("once: rollback to savepoint: %w", err))
		}
		return cause
	}
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
		d.fields.Add(watermill.LogFields{"err": err.Error()}))
	return nil
}

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
		d.fields.Add(watermill.LogFields{"err": cause.Error()}))
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
			e.logger.Error("Could not read the claim that a copy lost to", err, d.fields)
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
