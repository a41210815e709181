package once

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/pgwire"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// claim inserts the key first. It returns fresh=false for a duplicate, after checking the
// fingerprint of the applied copy.
func (e *Middleware) claim(ctx context.Context, tx *sql.Tx, d *delivery) (fresh bool, err error) {
	args := []any{d.consumer, d.key, d.fingerprint}
	if e.q.daily {
		args = append(args, partition.Day(d.occurredAt))
	}
	res, err := tx.ExecContext(ctx, e.q.claim, args...)
	return e.claimOutcome(ctx, tx, d, res, err)
}

// claimOutcome interprets the result of a claim statement (alone or last of a list).
func (e *Middleware) claimOutcome(ctx context.Context, tx *sql.Tx, d *delivery, res sql.Result, err error) (fresh bool, _ error) {
	lookupArgs := []any{d.consumer, d.key}
	if e.q.daily {
		lookupArgs = append(lookupArgs, partition.Day(d.occurredAt))
	}
	if err != nil {
		if txguard.IsMissing(err) {
			return false, fmt.Errorf("once: a table or function of schema %q is missing (processed_messages, attempt_guard, attempt_begin, attempt_open): run the migrations: %w", e.config.Schema, err)
		}
		if e.q.daily && pgtx.SQLState(err) == pgtx.CodeCheckViolation {
			return false, &missingPartitionError{days: []time.Time{partition.Day(d.occurredAt)}, err: err}
		}
		if pgtx.IsSerializationFailure(err) {
			return false, &claimedAfterSnapshotError{err: err} // still retryable as a new transaction
		}
		return false, fmt.Errorf("once: claim: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		d.claimed()
		return true, e.checkAge(d)
	}
	d.countDuplicate()
	var stored []byte
	var processedAt time.Time
	if err := tx.QueryRowContext(ctx, e.q.lookup, lookupArgs...).Scan(&stored, &processedAt); err != nil {
		// The duplicate is certain (the insert conflicted); only the fingerprint check is lost.
		e.logger.Error("Duplicate skipped, but its applied copy could not be read to compare payloads", err, d.logFields())
		return false, nil
	}
	return false, e.reportDuplicate(d, stored, processedAt)
}

// claimed records a fresh claim.
func (d *delivery) claimed() {
	if d.recording {
		d.span.SetAttributes(tracing.Fresh.Bool(true), tracing.Duplicate.Bool(false))
		d.span.AddEvent(tracing.EventClaim, trace.WithAttributes(tracing.Fresh.Bool(true)))
	}
}

// checkAge is the age guard, applied to fresh claims only: a copy whose key still exists is a
// plain duplicate, whatever its age.
func (e *Middleware) checkAge(d *delivery) error {
	if e.config.MaxMessageAge == 0 || !d.hasOccurredAt {
		return nil
	}
	age := e.config.Now().Sub(d.occurredAt)
	if age <= e.config.MaxMessageAge {
		return nil
	}
	d.counters.tooOld.Add(1)
	err := wmonce.Permanent(fmt.Errorf("%w: event occurred %s ago (at %s), beyond MaxMessageAge %s: its key may already have been deleted by retention, so applying it could apply it twice",
		wmonce.ErrTooOld, age.Round(time.Second), d.occurredAt.Format(time.RFC3339), e.config.MaxMessageAge))
	e.logger.Error("ALERT: copy older than the retention window refused, not applied", err, d.logFields())
	return err
}

// countDuplicate counts a skipped copy and marks its span as a duplicate.
func (d *delivery) countDuplicate() {
	d.counters.duplicates.Add(1)
	if d.recording {
		d.span.SetAttributes(tracing.Fresh.Bool(false))
		tracing.MarkDuplicate(d.span, false)
	}
}

// reportDuplicate logs a skipped copy and compares its payload with the applied one's. It
// returns a permanent error only for a mismatch under RejectFingerprintMismatch.
func (e *Middleware) reportDuplicate(d *delivery, stored []byte, processedAt time.Time) error {
	if bytes.Equal(stored, d.fingerprint) {
		e.logDuplicate(d, "Duplicate skipped: already applied", d.logFields().Add(watermill.LogFields{"processed_at": processedAt}))
		return nil
	}
	d.countMismatch()
	e.observer.duplicate(d.consumer, true)
	mismatch := fmt.Errorf("payload fingerprint mismatch: key %q was applied at %s with a different payload; two different events share one id", d.key, processedAt.Format(time.RFC3339))
	e.logger.Error("Duplicate with a DIFFERENT payload: not applied", mismatch, d.logFields())
	if e.config.RejectFingerprintMismatch {
		return wmonce.Permanent(mismatch)
	}
	return nil
}

// countMismatch counts a duplicate whose payload differs from the applied copy's.
func (d *delivery) countMismatch() {
	d.counters.mismatches.Add(1)
	if d.recording {
		d.span.SetAttributes(tracing.FingerprintMismatch.Bool(true))
	}
}

// duplicateLogInterval is how often, at most, the middleware logs a summary of the duplicates
// it skipped for one consumer. A redelivery storm can skip thousands of copies a second: each is
// logged at debug level and counted (Counters.Duplicates, the wmonce metrics), and at info level
// only the first of a quiet spell and then one line per interval with the number since the last
// line. Duplicates whose payload differs from the applied copy's are logged at error level, each.
const duplicateLogInterval = time.Minute

// duplicateLog summarises one consumer's skipped duplicates at info level.
type duplicateLog struct {
	mu      sync.Mutex
	last    time.Time // when the last info line was logged
	skipped uint64    // duplicates since then
}

// logDuplicate logs one skipped copy (and tells the observer): at debug level always, and at
// info level when the consumer's last info line is duplicateLogInterval old (or there was
// none), with the number of duplicates it summarises.
func (e *Middleware) logDuplicate(d *delivery, msg string, fields watermill.LogFields) {
	e.observer.duplicate(d.consumer, false)
	e.logger.Debug(msg, fields)
	v, _ := e.dupLogs.LoadOrStore(d.consumer, &duplicateLog{})
	l := v.(*duplicateLog)
	now := e.config.Now()
	l.mu.Lock()
	l.skipped++
	if !l.last.IsZero() && now.Sub(l.last) < duplicateLogInterval {
		l.mu.Unlock()
		return
	}
	n, since := l.skipped, l.last
	l.last, l.skipped = now, 0
	l.mu.Unlock()
	summary := watermill.LogFields{"consumer": d.consumer, "duplicates": n}
	if since.IsZero() {
		e.logger.Info(msg+" (further duplicates of this consumer are summarised once a minute; each one is logged at debug level)", fields.Add(summary))
		return
	}
	summary["since"] = since.Format(time.RFC3339)
	e.logger.Info("Duplicates skipped since the last summary: already applied", summary)
}

// apply runs the handler with tx in the message context and stores what it returns in the outbox
// (internal/lend, the step the inbox Processor shares), counting what went wrong.
func (e *Middleware) apply(ctx context.Context, h message.HandlerFunc, d *delivery, tx *sql.Tx) error {
	step := &e.step
	if d.inSubscriberTx {
		step = &e.subStep
	}
	outcome, err := step.Handle(ctx, tx, h, lend.Delivery{
		Msg: d.msg, Consumer: d.consumer, Key: d.key, OutputTopic: d.outputTopic, Shared: d.sharedTx, HandlerAcked: &d.counters.handlerAcked,
	})
	switch outcome {
	case lend.EndedTx:
		return e.handlerEndedTx(d, err)
	case lend.HandlerFailed, lend.OutputRefused:
		d.counters.failed.Add(1)
	}
	return err
}

// handlerEndedTx reports a delivery whose handler ended the transaction it was lent and returns
// ended, the permanent error (from txguard or lend).
func (e *Middleware) handlerEndedTx(d *delivery, ended error) error {
	d.counters.endedTx.Add(1)
	e.logger.Error("The handler ended the transaction it was given (Commit or Rollback): nothing of it was applied; the message is a permanent failure", ended, d.logFields())
	return ended
}

// isEnded reports a txguard error of a handler that ended its transaction.
func isEnded(err error) bool { return errors.Is(err, wmonce.ErrHandlerEndedTx) }

// committed records the outcome of the transaction's COMMIT on the delivery's span.
func (d *delivery) committed(err error) {
	if !d.recording {
		return
	}
	if err != nil {
		d.span.AddEvent(tracing.EventCommit, trace.WithAttributes(tracing.Outcome.String("failed: "+err.Error())))
		return
	}
	d.span.AddEvent(tracing.EventCommit)
}

// ensurePartition creates the partition err asks for, in a transaction of its own, and
// reports whether it did.
func (e *Middleware) ensurePartition(ctx context.Context, err error) bool {
	var mp *missingPartitionError
	if !errors.As(err, &mp) {
		return false
	}
	for _, day := range mp.days {
		if perr := partition.Ensure(ctx, e.db, e.config.Schema, day, day); perr != nil {
			e.logger.Error("Could not create partition", perr, watermill.LogFields{"day": day.Format(time.DateOnly)})
			return false
		}
	}
	return true
}

// missingPartitionError asks the caller to create partitions and try again.
type missingPartitionError struct {
	days []time.Time
	err  error
}

func (e *missingPartitionError) Error() string {
	return fmt.Sprintf("once: a partition of processed_messages_daily is missing (days %v): %v", e.days, e.err)
}

func (e *missingPartitionError) Unwrap() error { return e.err }

// claimQueries are the statements on the claims table: processed_messages, or
// processed_messages_daily with PartitionByDay (whose statements take the day as last argument).
type claimQueries struct {
	daily            bool
	claim, lookup    string // one key
	claimMany        string // many keys: unnest arrays, RETURNING the fresh ones
	lookupMany       string
	savepointClaim   string // the subscriber-transaction path: savepoint, guard and claim at once
	savepointRelease string
	doom             string
}

// With wireGuard the own-transaction claim does not open the server's attempt guard: the
// connection guards the transaction (txguard.For) and the server does no work for it.
func newClaimQueries(schema string, daily, wireGuard bool) claimQueries {
	t := pgtx.QualifiedName(schema, "processed_messages")
	cols, arrays, dayCond := "consumer, message_id, payload_sha256", "$1::text[], $2::text[], $3::bytea[]", ""
	typed := "$1::text, $2::text, $3::bytea"
	if daily {
		t = pgtx.QualifiedName(schema, partition.Parent)
		cols, arrays, dayCond = cols+", occurred_on", arrays+", $4::date[]", " AND occurred_on = $3"
		typed += ", $4::date"
	}
	// The own-transaction claim opens the server's attempt guard as it goes (internal/txguard).
	claim := `INSERT INTO ` + t + ` (` + cols + `) SELECT ` + typed + ` WHERE ` + txguard.Condition(schema) + ` ON CONFLICT DO NOTHING`
	if wireGuard {
		claim = `INSERT INTO ` + t + ` (` + cols + `) VALUES (` + typed + `) ON CONFLICT DO NOTHING`
	}
	return claimQueries{
		daily:  daily,
		claim:  claim,
		lookup: `SELECT payload_sha256, processed_at FROM ` + t + ` WHERE consumer = $1 AND message_id = $2` + dayCond,
		claimMany: `INSERT INTO ` + t + ` (` + cols + `)
SELECT * FROM unnest(` + arrays + `)
ON CONFLICT DO NOTHING RETURNING consumer, message_id`,
		lookupMany: `SELECT p.consumer, p.message_id, p.payload_sha256, p.processed_at
FROM unnest($1::text[], $2::text[]) AS k(consumer, message_id)
JOIN ` + t + ` p USING (consumer, message_id)`,
		savepointClaim: pgwire.GuardOpen + spBegin + `;
INSERT INTO ` + t + ` (` + cols + `) SELECT ` + typed + ` WHERE ` + txguard.Condition(schema) + ` ON CONFLICT DO NOTHING`,
		savepointRelease: fmt.Sprintf(spRelease, pgtx.QualifiedName(schema, "attempt_close")),
		doom:             fmt.Sprintf(spDoom, pgtx.QualifiedName(schema, "attempt_doom")),
	}
}

// Savepoint statements for the subscriber-transaction path. Each is sent in one round trip at
// most: pgx sends a statement list without arguments with the simple protocol. The attempt opens
// with spBegin and the claim in one list (claimQueries.savepointClaim), whose arguments pgx
// quotes itself (QueryExecModeSimpleProtocol; never string concatenation). The claim is
// conditional on attempt_begin() (migration 010), which marks the attempt open in a
// transaction-local setting, inserts the transaction's one guard row on its first attempt, and
// refuses (SQLSTATE WM001) in a doomed transaction. The setting is reverted with the savepoint
// when an attempt is rolled back, and the guard row's deferred trigger refuses a COMMIT while it
// says open or doomed. When the subscriber's pool is from pgtx.Open, its connection guards the
// attempt on the wire as well (pgwire.GuardOpen leads the claim, pgwire.GuardClose every
// statement that ends the attempt; elsewhere they are comments): a COMMIT or ROLLBACK the
// handler sends as SQL text is refused there, and nothing after it reaches the server.
// spRelease and spRollback are pgwire.DeferredPrefix statements: on a pool
// from pgtx.Open they travel with the transaction's next statement (the next message's claim,
// or the subscriber's offset update and COMMIT), which therefore cannot run without them, so
// they cost no round trip of their own.
const (
	spBegin    = `SAVEPOINT wmonce_attempt`
	spRelease  = pgwire.DeferredPrefix + pgwire.GuardClose + `CALL %s(); RELEASE SAVEPOINT wmonce_attempt`
	spRollback = pgwire.DeferredPrefix + pgwire.GuardClose + `ROLLBACK TO SAVEPOINT wmonce_attempt; RELEASE SAVEPOINT wmonce_attempt`
	// spDoom undoes the attempt and marks the transaction doomed: its COMMIT fails (the guard
	// row's deferred trigger) and every later attempt_begin() in it refuses with WM001.
	spDoom = pgwire.GuardClose + `ROLLBACK TO SAVEPOINT wmonce_attempt; RELEASE SAVEPOINT wmonce_attempt; SELECT %s()`
	// codeAttemptRefused is attempt_begin()'s refusal in a doomed transaction.
	codeAttemptRefused = "WM001"
)
