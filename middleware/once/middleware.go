package once

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/kithook"
	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

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
	// subStep is step in watermill-sql's subscriber transaction, whose pool may not be db's:
	// its check is the server's guard, which the claim opened there (attempt_begin).
	subStep lend.Step
	group   *groupCommitter
	ended   endedSubscriberTxs // subscriber transactions that a handler ended (see subscriber_tx.go)

	counts  sync.Map // CounterKey -> *counters
	dupLogs sync.Map // consumer -> *duplicateLog

	observer duplicateObserver // told of each duplicate: the admin charts' rows (duplicate_history.go)
}

// New validates config and prepares the middleware. db must reach PostgreSQL;
// the tables must exist (run migrate first).
func New(db *sql.DB, config Config, logger watermill.LoggerAdapter) (*Middleware, error) {
	logger, err := setup.Component(db, "once: db is nil: open one with pgtx.Open", &config, (*Config).setDefaults, "once: invalid config", logger)
	if err != nil {
		return nil, err
	}
	if config.StartCheck != nil {
		if err := config.StartCheck(context.Background(), config.Consumer, config.MaxMessageAge); err != nil {
			return nil, fmt.Errorf("once: start check: %w", err)
		}
	}
	ob := config.Outbox
	if ob == nil {
		w, err := outbox.NewWriter(outbox.Config{Schema: config.Schema, Source: config.OutboxSource, TracerProvider: config.TracerProvider})
		if err != nil {
			return nil, fmt.Errorf("once: %w", err)
		}
		ob = w
	}
	e := &Middleware{
		db:     db,
		config: config,
		logger: logger,
		tracer: tracing.Tracer(config.TracerProvider),
		guard:  txguard.For(config.Schema, db),

		observer: &duplicateHistory{db: db, schema: config.Schema, now: config.Now, logger: logger},
	}
	e.q = newClaimQueries(config.Schema, config.PartitionByDay, e.guard.OnWire())
	step := func(guard txguard.Guard) lend.Step {
		return lend.Step{
			Component: "once", Guard: guard, Outbox: ob, Tracer: e.tracer, Unstorable: ErrUnstorableOutput, Logger: logger,
			NoTopic: "add the handler with router.AddHandler(..., publishTopic, ...) or set Config.OutputTopic",
		}
	}
	e.step, e.subStep = step(e.guard), step(txguard.New(config.Schema))
	if !config.GroupCommit.Disabled {
		e.group = newGroupCommitter(e, config.GroupCommit)
	}
	return e, nil
}

// Close stops group commit, answering messages still queued with an error (they are nacked and
// redelivered), waits for the groups running, and writes the duplicates per minute not written
// yet (written at most a second after they happen). Call it after the router has closed. It is
// idempotent; without it nothing leaks (a lane ends when nobody waits), and the admin page's
// duplicates charts miss at most the last second of duplicates.
func (e *Middleware) Close() error {
	if e.group != nil {
		e.group.close()
	}
	e.observer.close()
	return nil
}

// Middleware wraps h. It returns no messages to the router: messages h returns are stored in
// the outbox in the same transaction and reach the broker through the relay.
func (e *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (_ []*message.Message, err error) {
		origCtx := msg.Context()
		// Subscribers re-send msg.Copy() with their own context and Retry reuses msg: leave the
		// message as we found it.
		defer msg.SetContext(origCtx)
		// The subscriber's transaction is looked up once per delivery: each lookup walks the
		// whole context chain, which the router and the subscriber make long.
		var subTx *sql.Tx
		if !e.config.DisableSubscriberTxReuse {
			subTx, _ = pgtx.SubscriberTxFromContext(origCtx)
		}
		ctx, span := e.startSpan(origCtx, msg, subTx != nil)
		defer func() { tracing.End(span, err) }()

		d, err := e.newDelivery(msg)
		if err != nil {
			return nil, err
		}
		d.traced(span)
		if subTx != nil {
			d.sharedTx, d.inSubscriberTx = true, true
			return nil, e.runInSubscriberTx(ctx, h, d, subTx) // subscriber_tx.go
		}
		if !e.config.DisableSubscriberTxReuse {
			if err := pgtx.UnsupportedSubscriberTx(ctx); err != nil {
				d.counters.refused.Add(1)
				e.logger.Error("Message refused, not applied (the Stack parks it; without a poison queue it is nacked)", err, d.logFields())
				return nil, err
			}
		}
		return nil, e.runOutsideSubscriberTx(ctx, h, d)
	}
}

// runOutsideSubscriberTx runs a delivery in a transaction of its own or, with group commit, in
// a group's (group_commit.go). With a lane free and nobody waiting (Linger 0), it runs at once
// in the caller's goroutine in a transaction of its own, exactly as without group commit: a
// lone message pays nothing for it. Otherwise it waits, and the next lane to free up takes
// everything waiting (up to TxBatchSize) as one group. Either way its context survives
// Router.Close for ShutdownGrace. A delivery still waiting when its shutdown grace is over, or
// its deadline passes, gives up; one that a lane has taken waits for its group's outcome,
// since the group may hold its claim.
func (e *Middleware) runOutsideSubscriberTx(ctx context.Context, h message.HandlerFunc, d *delivery) error {
	ctx, release := detachForShutdown(ctx, e.config.ShutdownGrace)
	defer release()
	if e.group == nil {
		return e.runInOwnTx(ctx, h, d)
	}
	if !e.group.lanes.Alone() {
		d.tracedPath(pathGroupCommit)
		return e.group.lanes.Wait(ctx, member{d: d, h: h})
	}
	defer e.group.lanes.Release()
	d.tracedPath(pathOwnTx)
	return e.runInOwnTx(ctx, h, d)
}

// startSpan starts the consumer span of one delivery: a child of the trace context the
// message carries (see internal/tracing.StartConsumer). It ends when the middleware returns.
func (e *Middleware) startSpan(ctx context.Context, msg *message.Message, inSubscriberTx bool) (context.Context, trace.Span) {
	if inSubscriberTx {
		return tracing.StartConsumer(ctx, e.tracer, tracing.SpanOnce, msg, tracing.Path.String(pathSubscriberTx))
	}
	if e.group != nil {
		// With group commit on, a delivery runs alone or in a group: the path is known only
		// when the queue decides (runOutsideSubscriberTx, tracedPath).
		return tracing.StartConsumer(ctx, e.tracer, tracing.SpanOnce, msg)
	}
	return tracing.StartConsumer(ctx, e.tracer, tracing.SpanOnce, msg, tracing.Path.String(pathOwnTx))
}

// The values of the wmonce.path attribute: which transaction a delivery ran in.
const (
	pathOwnTx        = "own_tx"        // one of its own
	pathGroupCommit  = "group_commit"  // a group's, shared with the deliveries that waited with it
	pathSubscriberTx = "subscriber_tx" // watermill-sql's subscriber transaction
)

// tracedPath records which transaction the delivery runs in, once group commit decided it.
func (d *delivery) tracedPath(path string) {
	if d.recording {
		d.span.SetAttributes(tracing.Path.String(path))
	}
}

// delivery is what the middleware knows about one delivered message.
type delivery struct {
	msg         *message.Message
	consumer    string
	key         string
	fingerprint []byte
	outputTopic string
	counters    *counters

	occurredAt    time.Time
	hasOccurredAt bool

	// sharedTx: the transaction holds other messages' work too (a group, or watermill-sql's
	// subscriber transaction), so whether the handler ended it is checked right after it.
	sharedTx bool
	// inSubscriberTx: the transaction is watermill-sql's subscriber's.
	inSubscriberTx bool

	copies []*queued // group commit: later copies of this key in the same group

	span trace.Span // the delivery's consumer span (startSpan)
	// recording: span records what it is given. Without a tracer provider it does not, and the
	// attributes and events of each step are not even built.
	recording bool

	sum [sha256.Size]byte // fingerprint's array: one allocation with the delivery
}

// logFields are the fields of the delivery's log lines, built only when a line is logged.
func (d *delivery) logFields() watermill.LogFields {
	return watermill.LogFields{"consumer": d.consumer, "dedupe_key": d.key, "message_uuid": d.msg.UUID}
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
		if err := setup.CheckName("the handler name used as consumer", consumer); err != nil {
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
	view := lend.View(msg) // what the key functions get: they cannot ack the delivery
	key, err := e.config.Key(view)
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
		occurredAt, hasOccurredAt, err = e.config.OccurredAt(view)
	}
	if err != nil {
		return refuse(wmonce.Permanent(fmt.Errorf("%w: message %q (consumer %q): %w", wmonce.ErrMalformedMetadata, msg.UUID, consumer, err)))
	}
	if e.config.PartitionByDay && !hasOccurredAt {
		return refuse(wmonce.Permanent(fmt.Errorf("%w: message %q (consumer %q) carries no occurred_at, which PartitionByDay needs to find its partition: publish through the outbox (it stamps it) or configure OccurredAt", wmonce.ErrMalformedMetadata, msg.UUID, consumer)))
	}
	topic := e.config.OutputTopic
	if topic == "" {
		topic = message.PublishTopicFromCtx(ctx)
	}
	d := &delivery{
		msg:         msg,
		consumer:    consumer,
		key:         key,
		outputTopic: topic,
		counters:    c,

		occurredAt:    occurredAt,
		hasOccurredAt: hasOccurredAt,

		sum: sha256.Sum256(msg.Payload),
	}
	d.fingerprint = d.sum[:]
	return d, nil
}

func (e *Middleware) checkKey(key string) error { return setup.CheckKey(key, e.config.MaxKeyLength) }

func (e *Middleware) countersFor(consumer, sender string) *counters {
	k := CounterKey{consumer, sender}
	if c, ok := e.counts.Load(k); ok {
		return c.(*counters)
	}
	if sender != "" && e.senders(consumer) >= maxSenders {
		k.Sender = overflowSender
	}
	c, _ := e.counts.LoadOrStore(k, &counters{})
	return c.(*counters)
}

func (e *Middleware) senders(consumer string) int {
	n := 0
	e.counts.Range(func(k, _ any) bool {
		if k.(CounterKey).Consumer == consumer {
			n++
		}
		return n < maxSenders
	})
	return n
}

type counters struct {
	fresh, duplicates, mismatches, failed, txRetries, refused, tooOld, endedTx, handlerAcked atomic.Uint64
	delayedRetries, delayedRetryNacked                                                       atomic.Uint64 // delayed_retry.go
}

// maxSenders bounds the sender label per consumer: metadata is producer-controlled, and an
// unbounded label would let a producer grow memory and metrics without limit.
const maxSenders = 100

const overflowSender = "_other"

// traced records the delivery's consumer and key on its span.
func (d *delivery) traced(span trace.Span) {
	d.span, d.recording = span, span.IsRecording()
	if d.recording {
		span.SetAttributes(tracing.Consumer.String(d.consumer), tracing.DedupeKey.String(d.key))
	}
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

// runInOwnTx is the normal path: one transaction of our own per attempt; ctx is detached
// from Router.Close for ShutdownGrace (runOutsideSubscriberTx).
func (e *Middleware) runInOwnTx(ctx context.Context, h message.HandlerFunc, d *delivery) error {
	var last error
	return pgtx.Retry(ctx, e.config.TxRetry, func(ctx context.Context, attempt int) error {
		if attempt > 1 {
			d.counters.txRetries.Add(1)
			e.logger.Debug("Transaction lost a race, running it again", d.logFields().Add(watermill.LogFields{"attempt": attempt - 1, "sqlstate": pgtx.SQLState(last)}))
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
	// the handler sends is refused by the server. The guard on the wire opens on its own, at
	// no cost: the connection answers it.
	if e.guard.OnWire() {
		if err := e.guard.Open(ctx, tx); err != nil {
			return fmt.Errorf("once: %w", err)
		}
	}
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

func init() {
	kithook.GroupCommitQueued = func(mw any) int {
		e := mw.(*Middleware)
		if e.group == nil {
			return 0
		}
		return e.group.lanes.Queued()
	}
}
