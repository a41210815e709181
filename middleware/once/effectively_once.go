package once

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/setup"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Config configures the effectively-once middleware.
type Config struct {
	// Schema holds processed_messages and the outbox (see package migrate). Default "wmonce".
	Schema string

	// Consumer scopes dedupe keys: two consumers sharing the table never see each other's keys.
	// Default: the name of the router handler the message arrives at. Set it explicitly when one
	// logical consumer runs under several handler names, or never rename the handler: a new
	// consumer name starts with an empty history and re-applies redelivered messages. A name is
	// checked by wmonce.CheckName (text PostgreSQL can store, at most 255 bytes): Config.Consumer
	// at construction, a handler name at the first message.
	Consumer string

	// Key returns each message's dedupe key. Default KeyFromUUID.
	Key wmonce.KeyFunc
	// MaxKeyLength refuses longer keys (in bytes) as invalid. Default 255, at most 1024.
	MaxKeyLength int

	// RejectFingerprintMismatch turns a duplicate whose payload differs from the applied one
	// into a permanent error (parked by the Stack) instead of an acked, reported duplicate.
	RejectFingerprintMismatch bool

	// Outbox stores the messages the handler returns. Default: a Writer on Schema with OutboxSource.
	Outbox *outbox.Writer
	// OutboxSource is the default Outbox's outbox.Config.Source: the service whose relay forwards
	// these messages when services share one schema (see outbox, Sources). Set it, or pass the
	// service's own Writer as Outbox, wherever the service's relay has a Source: rows of another
	// source are never forwarded by it. Setting both is an error.
	OutboxSource string
	// OutputTopic receives returned messages when the router handler has no publish topic
	// (AddConsumerHandler). When both are set, OutputTopic wins.
	OutputTopic string

	// TxOptions for the transaction the middleware opens. Default REPEATABLE READ. Handlers
	// run concurrently (Kafka: one per partition; RabbitMQ: AMQPConfig.Workers per
	// subscription; times the consumer instances of the group), and under READ COMMITTED a
	// handler that reads a row and writes back a value computed from it (read a counter, add
	// one, write it) silently loses the updates of handlers that commit in between. Under
	// REPEATABLE READ such a write fails with a serialization failure instead, and TxRetry
	// runs the whole transaction again on a fresh snapshot, so every update counts.
	// REPEATABLE READ does not stop write skew (two handlers each deciding on rows the other
	// writes): use SERIALIZABLE, or SELECT ... FOR UPDATE, for that. The claim itself needs
	// no more than READ COMMITTED (under REPEATABLE READ, a copy whose twin commits while it
	// waits on the key costs one retry): set it for handlers whose writes do not depend on
	// what they read, to skip the retries on contended rows. Not used for messages handled in
	// watermill-sql's subscriber transaction, which its PostgreSQL schemas begin at
	// REPEATABLE READ.
	TxOptions *sql.TxOptions
	// TxRetry bounds re-running the whole transaction (claim, handler, outbox) after a
	// serialization failure or deadlock; the handler runs again each time, so effects outside
	// the database would repeat. Default DefaultTxRetryAttempts attempts, with RetryPolicy's
	// jittered backoff from 5ms: enough for eight handlers updating one row at once. When
	// they are spent the error goes to the Stack's Retry and then nacks the message, which
	// the broker redelivers.
	TxRetry pgtx.RetryPolicy

	// DisableSubscriberTxReuse opens a transaction of our own even when the message comes
	// from watermill-sql's subscriber. By default its transaction is reused (see the package doc).
	DisableSubscriberTxReuse bool

	// SenderMetadataKey names a metadata field that identifies the producer (e.g. "sender" or
	// "service"). Counters are then kept per consumer and sender, so metrics show who sends
	// duplicates. At most 100 senders per consumer are told apart; the rest count as "_other".
	SenderMetadataKey string

	// OccurredAt returns when the event occurred, as carried by the message. Default: the
	// "occurred_at" metadata (RFC 3339) that the outbox stamps. ok=false means the message
	// carries no time. It is called only when MaxMessageAge or PartitionByDay needs the time
	// (the inbox Receiver's rule too); then a malformed value is an error and the message is
	// refused (permanent, wrapping wmonce.ErrMalformedMetadata). Otherwise the metadata is not
	// read at all, whatever its format.
	OccurredAt func(msg *message.Message) (t time.Time, ok bool, err error)

	// MaxMessageAge is the age guard: a copy whose key is not (or no longer) claimed and whose
	// event occurred longer ago than this is refused (a permanent error, parked by the Stack) and
	// reported, instead of being applied: its key may have been deleted by retention after the
	// original was applied. Set it a little below the retention window. Zero disables the guard;
	// messages that carry no time are not checked.
	MaxMessageAge time.Duration

	// PartitionByDay claims keys in processed_messages_daily, partitioned by the UTC day the
	// event occurred (OccurredAt), so that retention drops whole partitions. Every message must
	// then carry its time; one that does not is refused. Missing partitions are created on demand.
	PartitionByDay bool

	// Now is the clock of the age guard. Default time.Now.
	Now func() time.Time

	// GroupCommit groups messages in flight at the same time into one transaction. See
	// GroupCommitConfig for what it gains and what it asks of handlers. Off by default.
	GroupCommit GroupCommitConfig

	// ShutdownGrace is how long a handler already running may go on after the router closes
	// (Router.Close cancels every message context at once). Within it the transaction commits
	// normally; after it the transaction is cancelled and rolled back, and the message is
	// redelivered later. A negative value aborts at once. Default 5s; keep it below the router's
	// CloseTimeout. A deadline set by an outer Timeout middleware is always honoured at once.
	//
	// It has no effect on messages handled in watermill-sql's subscriber transaction (the
	// default for messages from that subscriber): the subscriber begins that transaction with
	// its subscription context, which Router.Close cancels, and database/sql rolls a
	// transaction back as soon as its context is cancelled. The running attempt is then rolled
	// back whatever the grace (nothing of it commits, not even the offset) and the message is
	// redelivered when the consumer runs again. Set DisableSubscriberTxReuse to let such
	// handlers finish within the grace in a transaction of their own.
	ShutdownGrace time.Duration

	// TracerProvider traces every delivery: a consumer span per message, the child of the
	// trace context the message carries, with the claim, the duplicate verdict and the commit as
	// events and the handler and the outbox store as child spans (see the package doc, Tracing).
	// It is also the default Outbox's TracerProvider. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// DefaultTxRetryAttempts is Config.TxRetry.MaxAttempts when unset. With eight handlers
// updating one row under REPEATABLE READ, three attempts left about 5% of the messages to the
// Stack's Retry (BenchmarkIsolationInterleaved); ten left none.
const DefaultTxRetryAttempts = 10

func (c *Config) setDefaults() {
	if c.Schema == "" {
		c.Schema = pgtx.DefaultSchema
	}
	wmonce.SetKeyDefaults(&c.Key, &c.MaxKeyLength)
	if c.TxOptions == nil {
		c.TxOptions = &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
	}
	if c.TxRetry.MaxAttempts == 0 {
		c.TxRetry.MaxAttempts = DefaultTxRetryAttempts
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 5 * time.Second
	}
	if c.GroupCommit.Enabled {
		c.GroupCommit.setDefaults()
	}
	wmonce.SetAgeGuardDefaults(&c.OccurredAt, &c.Now, outbox.MetadataOccurredAt)
}

// Validate reports what to fix in a configuration.
func (c Config) Validate() error {
	var errs []error
	if err := pgtx.ValidateIdentifier("schema", c.Schema); err != nil {
		errs = append(errs, err)
	}
	if c.Outbox != nil && c.OutboxSource != "" {
		errs = append(errs, errors.New("set OutboxSource or Outbox, not both: give the Writer its Source (outbox.Config.Source)"))
	}
	if c.Consumer != "" {
		if err := wmonce.CheckName("Consumer", c.Consumer); err != nil {
			errs = append(errs, fmt.Errorf("%w; or leave Consumer empty to use the handler name", err))
		}
	}
	if err := wmonce.CheckMaxKeyLength(c.MaxKeyLength); err != nil {
		errs = append(errs, err)
	}
	if c.OutputTopic != "" {
		if err := outbox.DefaultValidateTopic(c.OutputTopic); err != nil {
			errs = append(errs, fmt.Errorf("OutputTopic: %w", err))
		}
	}
	if err := c.GroupCommit.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MaxMessageAge < 0 {
		errs = append(errs, errors.New("MaxMessageAge must not be negative"))
	}
	if c.TxRetry.MaxAttempts < 0 {
		errs = append(errs, errors.New("TxRetry.MaxAttempts must not be negative"))
	}
	return errors.Join(errs...)
}

// Middleware makes a Watermill handler apply each message once, however often it is
// delivered. See the package documentation for the exact guarantee.
type Middleware struct {
	db     *sql.DB
	config Config
	logger watermill.LoggerAdapter
	tracer trace.Tracer

	q     claimQueries
	guard txguard.Guard
	step  lend.Step // runs the handler in the transaction and stores its output
	group *groupCommitter
	ended endedSubscriberTxs // subscriber transactions that a handler ended (see subscriber_ended.go)

	counts  sync.Map // CounterKey -> *counters
	dupLogs sync.Map // consumer -> *duplicateLog
}

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

func newClaimQueries(schema string, daily bool) claimQueries {
	t := pgtx.QualifiedName(schema, "processed_messages")
	cols, arrays, dayCond := "consumer, message_id, payload_sha256", "$1::text[], $2::text[], $3::bytea[]", ""
	typed := "$1::text, $2::text, $3::bytea"
	if daily {
		t = pgtx.QualifiedName(schema, partition.Parent)
		cols, arrays, dayCond = cols+", occurred_on", arrays+", $4::date[]", " AND occurred_on = $3"
		typed += ", $4::date"
	}
	// The attempt state of migration 010 (see spBegin): a transaction-local setting per schema.
	state := txguard.StateSetting(schema)
	return claimQueries{
		daily: daily,
		// The own-transaction claim opens the attempt guard as it goes (see internal/txguard).
		claim:  `INSERT INTO ` + t + ` (` + cols + `) SELECT ` + typed + ` WHERE ` + txguard.Condition(schema) + ` ON CONFLICT DO NOTHING`,
		lookup: `SELECT payload_sha256, processed_at FROM ` + t + ` WHERE consumer = $1 AND message_id = $2` + dayCond,
		claimMany: `INSERT INTO ` + t + ` (` + cols + `)
SELECT * FROM unnest(` + arrays + `)
ON CONFLICT DO NOTHING RETURNING consumer, message_id`,
		lookupMany: `SELECT p.consumer, p.message_id, p.payload_sha256, p.processed_at
FROM unnest($1::text[], $2::text[]) AS k(consumer, message_id)
JOIN ` + t + ` p USING (consumer, message_id)`,
		savepointClaim: spBegin + `;
INSERT INTO ` + t + ` (` + cols + `) SELECT ` + typed + ` WHERE ` + txguard.Condition(schema) + ` ON CONFLICT DO NOTHING`,
		savepointRelease: fmt.Sprintf(spRelease, state),
		doom:             fmt.Sprintf(spDoom, pgtx.QualifiedName(schema, "attempt_doom")),
	}
}

// New validates config and prepares the middleware. db must reach PostgreSQL;
// the tables must exist (run migrate first).
func New(db *sql.DB, config Config, logger watermill.LoggerAdapter) (*Middleware, error) {
	logger, err := setup.Component(db, "once: db is nil: open one with pgtx.Open", &config, (*Config).setDefaults, "once: invalid config", logger)
	if err != nil {
		return nil, err
	}
	ob, err := outbox.WriterOrDefault(config.Outbox, outbox.Config{Schema: config.Schema, Source: config.OutboxSource, TracerProvider: config.TracerProvider})
	if err != nil {
		return nil, fmt.Errorf("once: %w", err)
	}
	e := &Middleware{
		db:     db,
		config: config,
		logger: logger,
		tracer: tracing.Tracer(config.TracerProvider),
		q:      newClaimQueries(config.Schema, config.PartitionByDay),
		guard:  txguard.New(config.Schema),
	}
	e.step = lend.Step{
		Component: "once", Guard: e.guard, Outbox: ob, Tracer: e.tracer, Unstorable: ErrUnstorableOutput,
		NoTopic: "add the handler with router.AddHandler(..., publishTopic, ...) or set Config.OutputTopic",
	}
	if config.GroupCommit.Enabled {
		e.group = newGroupCommitter(e, config.GroupCommit)
	}
	return e, nil
}

// Close stops the group-commit workers, answering messages still queued with an error (they
// are nacked and redelivered). It is idempotent and needed only with GroupCommit.
func (e *Middleware) Close() error {
	if e.group != nil {
		e.group.close()
	}
	return nil
}

// delivery is what the middleware knows about one delivered message.
type delivery struct {
	msg         *message.Message
	consumer    string
	key         string
	fingerprint []byte
	outputTopic string
	fields      watermill.LogFields
	counters    *counters

	occurredAt    time.Time
	hasOccurredAt bool

	// sharedTx: the transaction holds other messages' work too (a group, or watermill-sql's
	// subscriber transaction), so whether the handler ended it is checked right after it.
	sharedTx bool

	copies []*queued // group commit: later copies of this key in the same group

	span trace.Span // the delivery's consumer span (see tracing.go)
}

// Middleware wraps h. It returns no messages to the router: messages h returns are stored in
// the outbox in the same transaction and reach the broker through the relay.
func (e *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (_ []*message.Message, err error) {
		origCtx := msg.Context()
		// Subscribers re-send msg.Copy() with their own context and Retry reuses msg: leave the
		// message as we found it.
		defer msg.SetContext(origCtx)
		ctx, span := e.startSpan(origCtx, msg)
		defer func() { tracing.End(span, err) }()

		d, err := e.newDelivery(msg)
		if err != nil {
			return nil, err
		}
		d.traced(span)
		if !e.config.DisableSubscriberTxReuse {
			if err := pgtx.UnsupportedSubscriberTx(ctx); err != nil {
				d.counters.refused.Add(1)
				e.logger.Error("Message refused, not applied (the Stack parks it; without a poison queue it is nacked)", err, d.fields)
				return nil, err
			}
		}
		if tx, ok := pgtx.SubscriberTxFromContext(ctx); ok && !e.config.DisableSubscriberTxReuse {
			d.sharedTx = true
			return nil, e.runInSubscriberTx(ctx, h, d, tx)
		}
		if e.group != nil {
			return nil, e.group.submit(ctx, h, d)
		}
		return nil, e.runInOwnTx(ctx, h, d)
	}
}

func (e *Middleware) newDelivery(msg *message.Message) (*delivery, error) {
	ctx := msg.Context()
	consumer := e.config.Consumer
	if consumer == "" {
		consumer = message.HandlerNameFromCtx(ctx)
		if consumer == "" {
			return nil, wmonce.Permanent(ErrNoConsumer)
		}
		// Config.Consumer was checked at construction; a handler name is checked here, by
		// the same rule, as it cannot be before the first message.
		if err := wmonce.CheckName("the handler name used as consumer", consumer); err != nil {
			return nil, wmonce.Permanent(fmt.Errorf("%w: %w", ErrNoConsumer, err))
		}
	}
	var sender string
	if e.config.SenderMetadataKey != "" {
		sender = msg.Metadata.Get(e.config.SenderMetadataKey)
	}
	c := e.countersFor(consumer, sender)
	refuse := func(err error) (*delivery, error) {
		c.refused.Add(1)
		e.logger.Error("Message refused, not applied (the Stack parks it; without a poison queue it is nacked)", err, watermill.LogFields{"consumer": consumer, "message_uuid": msg.UUID})
		return nil, err
	}
	key, err := e.config.Key(msg)
	if err == nil {
		err = e.checkKey(key)
	}
	if err != nil {
		return refuse(wmonce.Permanent(fmt.Errorf("%w for message %q (consumer %q): %w", wmonce.ErrInvalidKey, msg.UUID, consumer, err)))
	}
	// The event time is read only when something needs it (the age guard, day partitions), the
	// inbox's rule too: a producer whose occurred_at is in another format is not refused for it
	// unless a feature that depends on it is on.
	var occurredAt time.Time
	var hasOccurredAt bool
	if e.config.MaxMessageAge > 0 || e.config.PartitionByDay {
		occurredAt, hasOccurredAt, err = e.config.OccurredAt(msg)
	}
	if err != nil {
		return refuse(wmonce.Permanent(fmt.Errorf("%w: message %q (consumer %q): %w", wmonce.ErrMalformedMetadata, msg.UUID, consumer, err)))
	}
	if e.config.PartitionByDay && !hasOccurredAt {
		return refuse(wmonce.Permanent(fmt.Errorf("%w: message %q (consumer %q) carries no occurred_at, which PartitionByDay needs to find its partition: publish through the outbox (it stamps it) or configure OccurredAt", wmonce.ErrMalformedMetadata, msg.UUID, consumer)))
	}
	sum := sha256.Sum256(msg.Payload)
	topic := e.config.OutputTopic
	if topic == "" {
		topic = message.PublishTopicFromCtx(ctx)
	}
	return &delivery{
		msg:         msg,
		consumer:    consumer,
		key:         key,
		fingerprint: sum[:],
		outputTopic: topic,
		fields:      watermill.LogFields{"consumer": consumer, "dedupe_key": key, "message_uuid": msg.UUID},
		counters:    c,

		occurredAt:    occurredAt,
		hasOccurredAt: hasOccurredAt,
	}, nil
}

func (e *Middleware) checkKey(key string) error { return wmonce.CheckKey(key, e.config.MaxKeyLength) }

// runInOwnTx is the normal path: one transaction of our own per attempt.
func (e *Middleware) runInOwnTx(origCtx context.Context, h message.HandlerFunc, d *delivery) error {
	ctx, release := detachForShutdown(origCtx, e.config.ShutdownGrace)
	defer release()
	var last error
	return pgtx.Retry(ctx, e.config.TxRetry, func(ctx context.Context, attempt int) error {
		if attempt > 1 {
			d.counters.txRetries.Add(1)
			e.logger.Debug("Transaction lost a race, running it again", d.fields.Add(watermill.LogFields{"attempt": attempt - 1, "sqlstate": pgtx.SQLState(last)}))
		}
		last = e.attemptOwnTx(ctx, h, d)
		if e.ensurePartition(ctx, last) {
			last = e.attemptOwnTx(ctx, h, d) // the missing day partition exists now
		}
		return last
	})
}

func (e *Middleware) attemptOwnTx(ctx context.Context, h message.HandlerFunc, d *delivery) (err error) {
	tx, err := e.db.BeginTx(ctx, e.config.TxOptions)
	if err != nil {
		return fmt.Errorf("once: begin: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback()
		}
	}()

	// The claim opens the attempt guard (internal/txguard): from here until Close, a COMMIT
	// the handler sends is refused by the server.
	fresh, err := e.claim(ctx, tx, d)
	if err != nil || !fresh {
		return err // a duplicate wrote nothing; the deferred rollback ends the transaction
	}
	if err := e.apply(ctx, h, d, tx); err != nil {
		return err
	}
	if err := e.guard.Close(ctx, tx); err != nil {
		if isEnded(err) {
			return e.handlerEndedTx(d, err)
		}
		return err
	}
	done = true
	err = tx.Commit()
	d.committed(err)
	if err != nil {
		// The outcome of a failed COMMIT can be unknown (connection lost). Nack either way: if it
		// did commit, the redelivery finds the key and is acked without effect.
		d.counters.failed.Add(1)
		return fmt.Errorf("once: commit: %w", err)
	}
	d.counters.fresh.Add(1)
	return nil
}

// Savepoint statements for the subscriber-transaction path. Each is sent in one round trip at
// most: pgx sends a statement list without arguments with the simple protocol. The attempt opens
// with spBegin and the claim in one list (claimQueries.savepointClaim), whose arguments pgx
// quotes itself (QueryExecModeSimpleProtocol; never string concatenation). The claim is
// conditional on attempt_begin() (migration 010), which marks the attempt open in a
// transaction-local setting, inserts the transaction's one guard row on its first attempt, and
// refuses (SQLSTATE WM001) in a doomed transaction. The setting is reverted with the savepoint
// when an attempt is rolled back, and the guard row's deferred trigger refuses a COMMIT while it
// says open or doomed. spRelease and spRollback are pgtx.DeferredPrefix statements: on a pool
// from pgtx.Open they travel with the transaction's next statement (the next message's claim,
// or the subscriber's offset update and COMMIT), which therefore cannot run without them, so
// they cost no round trip of their own.
const (
	spBegin    = `SAVEPOINT wmonce_attempt`
	spRelease  = pgtx.DeferredPrefix + `SET LOCAL %s = 'closed'; RELEASE SAVEPOINT wmonce_attempt`
	spRollback = pgtx.DeferredPrefix + `ROLLBACK TO SAVEPOINT wmonce_attempt; RELEASE SAVEPOINT wmonce_attempt`
	// spDoom undoes the attempt and marks the transaction doomed: its COMMIT fails (the guard
	// row's deferred trigger) and every later attempt_begin() in it refuses with WM001.
	spDoom = `ROLLBACK TO SAVEPOINT wmonce_attempt; RELEASE SAVEPOINT wmonce_attempt; SELECT %s()`
	// codeAttemptRefused is attempt_begin()'s refusal in a doomed transaction.
	codeAttemptRefused = "WM001"
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
		return rollback(fmt.Errorf("once: release savepoint: %w", err))
	}
	d.attemptComplete()
	// Counted when the attempt is complete: the subscriber's commit comes later and cannot be
	// observed from here. If that commit fails, the message is redelivered and counted again.
	d.counters.fresh.Add(1)
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
		e.logger.Error("Duplicate skipped, but its applied copy could not be read to compare payloads", err, d.fields)
		return false, nil
	}
	return false, e.reportDuplicate(d, stored, processedAt)
}

// reportDuplicate logs a skipped copy and compares its payload with the applied one's. It
// returns a permanent error only for a mismatch under RejectFingerprintMismatch.
func (e *Middleware) reportDuplicate(d *delivery, stored []byte, processedAt time.Time) error {
	if bytes.Equal(stored, d.fingerprint) {
		e.logDuplicate(d, "Duplicate skipped: already applied", d.fields.Add(watermill.LogFields{"processed_at": processedAt}))
		return nil
	}
	d.countMismatch()
	mismatch := fmt.Errorf("payload fingerprint mismatch: key %q was applied at %s with a different payload; two different events share one id", d.key, processedAt.Format(time.RFC3339))
	e.logger.Error("Duplicate with a DIFFERENT payload: not applied", mismatch, d.fields)
	if e.config.RejectFingerprintMismatch {
		return wmonce.Permanent(mismatch)
	}
	return nil
}

// apply runs the handler with tx in the message context and stores what it returns in the outbox
// (internal/lend, the step the inbox Processor shares), counting what went wrong.
func (e *Middleware) apply(ctx context.Context, h message.HandlerFunc, d *delivery, tx *sql.Tx) error {
	outcome, err := e.step.Handle(ctx, tx, h, lend.Delivery{Msg: d.msg, Consumer: d.consumer, Key: d.key, OutputTopic: d.outputTopic, Shared: d.sharedTx})
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
	e.logger.Error("The handler ended the transaction it was given (Commit or Rollback): nothing of it was applied; the message is a permanent failure", ended, d.fields)
	return ended
}

var errShutdownGrace = errors.New("once: router closed and ShutdownGrace elapsed")

// detachForShutdown returns a context that survives the cancellation Router.Close sends to
// every in-flight message for grace, so a handler that is nearly done can commit instead of
// being rolled back and redone. Deadlines (an outer Timeout middleware) apply at once.
func detachForShutdown(orig context.Context, grace time.Duration) (context.Context, func()) {
	if grace < 0 {
		return orig, func() {}
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(orig))
	if deadline, ok := orig.Deadline(); ok {
		var cancelDeadline context.CancelFunc
		ctx, cancelDeadline = context.WithDeadline(ctx, deadline)
		prev := cancel
		// The parent first, so ctx inherits the cause: cancelling the deadline child first
		// would end it with a bare context.Canceled, and a message whose own deadline passed
		// would not report DeadlineExceeded.
		cancel = func(cause error) { prev(cause); cancelDeadline() }
	}
	var timer atomic.Pointer[time.Timer]
	stop := context.AfterFunc(orig, func() {
		if errors.Is(orig.Err(), context.DeadlineExceeded) {
			cancel(context.Cause(orig))
			return
		}
		timer.Store(time.AfterFunc(grace, func() { cancel(errShutdownGrace) }))
	})
	return ctx, func() {
		stop()
		if t := timer.Load(); t != nil {
			t.Stop()
		}
		cancel(nil)
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
	e.logger.Error("ALERT: copy older than the retention window refused, not applied", err, d.fields)
	return err
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
