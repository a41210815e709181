package once

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
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
	ended   endedSubscriberTxs // subscriber transactions that a handler ended (see subscriber_ended.go)

	counts  sync.Map // CounterKey -> *counters
	dupLogs sync.Map // consumer -> *duplicateLog

	dupHistory duplicateHistory // duplicates per minute not written yet (duplicate_history.go)
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
// yet (see DuplicateFlushDelay). Call it after the router has closed. It is idempotent; without
// it nothing leaks (a lane ends when nobody waits), and the admin page's duplicates charts miss
// at most the last DuplicateFlushDelay of duplicates.
func (e *Middleware) Close() error {
	if e.group != nil {
		e.group.close()
	}
	e.flushDuplicatesAtClose()
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
	// inSubscriberTx: the transaction is watermill-sql's subscriber's.
	inSubscriberTx bool

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
			d.sharedTx, d.inSubscriberTx = true, true
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

func (e *Middleware) checkKey(key string) error { return setup.CheckKey(key, e.config.MaxKeyLength) }
