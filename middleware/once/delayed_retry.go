package once

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/pgtx"
)

// Delayed retries (StackConfig.DelayedRetries, docs/middleware.md): after the Stack's
// immediate retries, a transient failure is stored as a copy of the message in the
// Middleware's outbox, due after the next step of the schedule, in one transaction with a
// retry claim in processed_messages; the delivery is then acked.

// Metadata of a scheduled retry copy (docs/middleware.md, Delayed retries): "N:consumer" for
// the N-th retry of that consumer, and the failure that scheduled it (at most 512 bytes).
const (
	MetadataDelayedRetry      = "wmonce_delayed_retry"
	MetadataDelayedRetryError = "wmonce_delayed_retry_error"
)

// ErrDelayedRetriesExhausted is wrapped by the park reason of a message still failing after
// its last delayed retry.
var ErrDelayedRetriesExhausted = errors.New("once: delayed retries exhausted")

// Limits of StackConfig.DelayedRetries: longer waits belong in the inbox or a parked replay.
const (
	maxDelayedRetries   = 100
	maxDelayedRetryWait = 7 * 24 * time.Hour
	maxRetryErrorLength = 512
	// scheduleTimeout bounds the scheduling transaction, which runs detached from the
	// delivery's context (a Timeout middleware's deadline may be what failed it).
	scheduleTimeout = 10 * time.Second
	// retryKeyPrefix starts the message_id of a retry claim: "wmonce-retry/N/<dedupe key>".
	retryKeyPrefix = "wmonce-retry/"
)

func checkDelayedRetries(schedule []time.Duration) error {
	if len(schedule) > maxDelayedRetries {
		return fmt.Errorf("stack: DelayedRetries has %d steps; the limit is %d", len(schedule), maxDelayedRetries)
	}
	for i, d := range schedule {
		if d <= 0 || d > maxDelayedRetryWait {
			return fmt.Errorf("stack: DelayedRetries[%d] is %s: each wait must be positive and at most %s", i, d, maxDelayedRetryWait)
		}
	}
	return nil
}

// delayedRetry is the Stack's step between Timeout and Retry.
type delayedRetry struct {
	mw        *Middleware
	schedule  []time.Duration
	retryable func(error) bool
	// park parks a message whose schedule is exhausted; nil with DisableParking (nack).
	park   message.HandlerMiddleware
	logger watermill.LoggerAdapter
	claim  string
}

func newDelayedRetry(mw *Middleware, schedule []time.Duration, retryable func(error) bool, park message.HandlerMiddleware, logger watermill.LoggerAdapter) *delayedRetry {
	t := pgtx.QualifiedName(mw.config.Schema, "processed_messages")
	return &delayedRetry{
		mw: mw, schedule: schedule, retryable: retryable, park: park, logger: logger,
		claim: `INSERT INTO ` + t + ` (consumer, message_id, payload_sha256) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
	}
}

func (r *delayedRetry) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil || !r.retryable(err) || errors.Is(msg.Context().Err(), context.Canceled) {
			return out, err // Router.Close cancelled it: the broker redelivers it, nothing to schedule
		}
		return nil, r.later(msg, err)
	}
}

// later schedules the next delayed retry of msg, which failed with cause, and returns nil
// (ack); or parks it when the schedule is exhausted; or returns cause (nack) when it cannot
// schedule: a message is never lost.
func (r *delayedRetry) later(msg *message.Message, cause error) error {
	ctx := msg.Context()
	consumer := r.mw.config.Consumer
	if consumer == "" {
		consumer = message.HandlerNameFromCtx(ctx)
	}
	key, kerr := r.mw.config.Key(lend.View(msg))
	if consumer == "" || kerr != nil {
		return cause // the Middleware refused it already; nothing to scope a retry claim by
	}
	var sender string
	if r.mw.config.SenderMetadataKey != "" {
		sender = msg.Metadata.Get(r.mw.config.SenderMetadataKey)
	}
	c := r.mw.countersFor(consumer, sender)
	n := retryNumber(msg.Metadata.Get(MetadataDelayedRetry), consumer)
	fields := watermill.LogFields{"consumer": consumer, "dedupe_key": key, "message_uuid": msg.UUID, "delayed_retry": n + 1, "delayed_retries": len(r.schedule)}
	if n >= len(r.schedule) {
		exhausted := fmt.Errorf("%w (%d): %w", ErrDelayedRetriesExhausted, len(r.schedule), cause)
		if r.park == nil {
			return exhausted
		}
		_, err := r.park(func(*message.Message) ([]*message.Message, error) { return nil, exhausted })(msg)
		return err
	}
	topic := message.SubscribeTopicFromCtx(ctx)
	if topic == "" {
		c.delayedRetryNacked.Add(1)
		r.logger.Error("Delayed retry not scheduled: the message context names no topic it came from; nacked", cause, fields)
		return cause
	}
	ctx, span := tracing.StartConsumer(context.WithoutCancel(ctx), r.mw.tracer, tracing.SpanDelayedRetry, msg,
		tracing.Consumer.String(consumer), tracing.DedupeKey.String(key), tracing.DelayedRetry.Int(n+1))
	ctx, cancel := context.WithTimeout(ctx, scheduleTimeout)
	defer cancel()
	due := time.Now().Add(r.schedule[n])
	scheduled, err := r.store(ctx, msg, consumer, key, topic, n+1, due, cause)
	defer func() { tracing.End(span, err) }()
	switch {
	case err != nil:
		c.delayedRetryNacked.Add(1)
		r.logger.Error("Delayed retry could not be scheduled; nacked", err, fields.Add(watermill.LogFields{"cause": cause.Error()}))
		return cause
	case scheduled:
		c.delayedRetries.Add(1)
		span.AddEvent(tracing.EventDelayedRetry, trace.WithAttributes(tracing.Outcome.String("scheduled for "+due.UTC().Format(time.RFC3339Nano))))
		r.logger.Info("Message failed; delayed retry scheduled, delivery acked", fields.Add(watermill.LogFields{"due": due, "cause": cause.Error()}))
	default:
		span.AddEvent(tracing.EventDelayedRetry, trace.WithAttributes(tracing.Outcome.String("already scheduled")))
		r.logger.Debug("Copy of a message whose delayed retry is already scheduled; acked", fields)
	}
	return nil
}

// store claims retry n of the message's key and, when the claim is fresh, stores the retry
// copy due at due, in one transaction. A copy that finds the claim taken stores nothing:
// copies of one failing message collapse to one scheduled retry.
func (r *delayedRetry) store(ctx context.Context, msg *message.Message, consumer, key, topic string, n int, due time.Time, cause error) (bool, error) {
	sum := sha256.Sum256(msg.Payload)
	scheduled := false
	err := pgtx.RunInTx(ctx, r.mw.db, nil, r.mw.config.TxRetry, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, r.claim, consumer, retryKeyPrefix+strconv.Itoa(n)+"/"+key, sum[:])
		if err != nil {
			return fmt.Errorf("once: claim delayed retry: %w", err)
		}
		if k, _ := res.RowsAffected(); k == 0 {
			scheduled = false
			return nil
		}
		c := msg.Copy() // same UUID, payload and metadata: the same dedupe key
		c.Metadata.Set(MetadataDelayedRetry, strconv.Itoa(n)+":"+consumer)
		c.Metadata.Set(MetadataDelayedRetryError, truncateText(cause.Error(), maxRetryErrorLength))
		scheduled = true
		return r.mw.step.Outbox.PublishTxAt(ctx, tx, due, topic, c)
	})
	return scheduled, err
}

// retryNumber reads MetadataDelayedRetry: the number of delayed retries consumer already
// scheduled for this message (0 when absent, unreadable or another consumer's).
func retryNumber(v, consumer string) int {
	num, who, ok := strings.Cut(v, ":")
	if !ok || who != consumer {
		return 0
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// truncateText cuts s to at most n bytes of text the outbox can store (no NUL, no split
// UTF-8 sequence).
func truncateText(s string, n int) string {
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "")
	}
	return s
}
