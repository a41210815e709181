package once

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	wmonce "github.com/wmonce/watermill-once"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/outbox"
)

// StackConfig configures Stack.
type StackConfig struct {
	// Middleware is the transactional dedupe middleware. Required.
	Middleware *Middleware

	// Timeout bounds each delivery, retries included. Zero: no timeout.
	Timeout time.Duration

	// Retry re-runs a failed delivery, each attempt in a new transaction. Unset fields default to
	// MaxRetries 3, InitialInterval 100ms, Multiplier 2, MaxInterval 5s and the Stack's Logger;
	// ResetContextOnRetry is always on (a failed PostgreSQL transaction cannot be reused), and
	// permanent errors are never retried.
	Retry wmiddleware.Retry

	// PoisonPublisher and PoisonTopic park messages for which ShouldPark is true: the message is
	// published there (with Watermill's *_poisoned metadata) and acked, so it stops blocking its
	// partition or queue. Defaults: the Middleware's own outbox (outbox.Writer.ParkingPublisher,
	// committed before the ack) and DefaultPoisonTopic. Any message is made parkable first
	// (outbox.Parkable). The Writer's Publisher and DBPublisher are refused (outbox.ErrNotParking):
	// neither can park every message (docs/middleware.md, Parking).
	PoisonPublisher message.Publisher
	PoisonTopic     string
	// DisableParking turns the poison queue off: every error, permanent ones included, nacks
	// the message and the broker redelivers it, forever for a message that can never succeed
	// (it blocks its partition or queue). Use it only with a poison queue of your own outside
	// the Stack. It cannot be combined with PoisonPublisher, PoisonTopic or ShouldPark.
	DisableParking bool
	// ShouldPark decides which errors park a message. Default: permanent errors (bad key,
	// Permanent(err) from the handler, output without topic or that cannot be stored) and panics.
	// Transient errors are retried, then nacked for redelivery: a database outage must not park
	// every message.
	ShouldPark func(err error) bool
	// DelayedRetries are the waits of the delayed retries (e.g. 10s, 1m, 10m): a transient
	// failure left after Retry is stored in the Middleware's outbox for its topic and acked,
	// parked once they are exhausted. Default: none (off). Needs a relay (docs/middleware.md).
	DelayedRetries []time.Duration

	Logger watermill.LoggerAdapter
}

// Stack returns the recommended middlewares around the effectively-once middleware, outermost
// first, for router.AddMiddleware or handler.AddMiddleware:
//
//	Timeout -> [DelayedRetries] -> Retry -> PoisonQueue -> Middleware -> CorrelationID -> Recoverer -> handler
//
// Retry is outside the transaction so each attempt is a new transaction. The poison queue is
// inside Retry, parking only what ShouldPark selects, so permanent failures are parked at once
// while transient ones are retried. By default it parks into the Middleware's own outbox (topic
// DefaultPoisonTopic), committed before the ack: with no configuration beyond the Middleware,
// a message that can never succeed is parked and acked rather than redelivered forever in
// front of its partition or queue. CorrelationID and Recoverer are inside the transaction so
// that produced messages carry correlation ids into the outbox and a panic rolls back.
//
// Do not add Watermill's InstantAck or Deduplicator to the same handler: the first acks before
// the commit, the second records keys before the handler succeeds and loses failed messages.
func Stack(config StackConfig) ([]message.HandlerMiddleware, error) {
	if config.Middleware == nil {
		return nil, errors.New("stack: Middleware is required: create it with New")
	}
	if config.Timeout < 0 {
		return nil, errors.New("stack: Timeout must not be negative")
	}
	if config.DisableParking && (config.PoisonPublisher != nil || config.PoisonTopic != "" || config.ShouldPark != nil) {
		return nil, errors.New("stack: DisableParking turns the poison queue off: leave PoisonPublisher, PoisonTopic and ShouldPark unset")
	}
	if err := checkDelayedRetries(config.DelayedRetries); err != nil {
		return nil, err
	}
	if config.Logger == nil {
		config.Logger = watermill.NopLogger{}
	}
	poison, err := poisonQueue(config)
	if err != nil {
		return nil, err
	}
	retry := stackRetry(config)

	var stack []message.HandlerMiddleware
	if config.Timeout > 0 {
		stack = append(stack, wmiddleware.Timeout(config.Timeout))
	}
	if len(config.DelayedRetries) > 0 {
		d, err := stackDelayedRetry(config)
		if err != nil {
			return nil, err
		}
		stack = append(stack, d.middleware)
	}
	stack = append(stack, retry.Middleware)
	if poison != nil {
		stack = append(stack, poison)
	}
	stack = append(stack,
		config.Middleware.Middleware,
		wmiddleware.CorrelationID,
		wmiddleware.Recoverer,
	)
	return stack, nil
}

// Defaults of StackConfig.Retry.
const (
	defaultRetryMaxRetries      = 3
	defaultRetryInitialInterval = 100 * time.Millisecond
	defaultRetryMultiplier      = 2
	defaultRetryMaxInterval     = 5 * time.Second
)

// stackRetry is the Stack's Retry: config.Retry with its defaults, a new transaction per
// attempt, and never a retry of a permanent error.
func stackRetry(config StackConfig) wmiddleware.Retry {
	retry := config.Retry
	retry.MaxRetries = cmp.Or(retry.MaxRetries, defaultRetryMaxRetries)
	retry.InitialInterval = cmp.Or(retry.InitialInterval, defaultRetryInitialInterval)
	retry.Multiplier = cmp.Or(retry.Multiplier, defaultRetryMultiplier)
	retry.MaxInterval = cmp.Or(retry.MaxInterval, defaultRetryMaxInterval)
	if retry.Logger == nil {
		retry.Logger = config.Logger
	}
	retry.ResetContextOnRetry = true
	userShouldRetry := retry.ShouldRetry
	retry.ShouldRetry = func(p wmiddleware.RetryParams) bool {
		if wmonce.IsPermanent(p.Err) {
			return false
		}
		return userShouldRetry == nil || userShouldRetry(p)
	}
	return retry
}

// DefaultPoisonTopic is where Stack parks by default. It is valid on every broker the broker
// package supports (SQL, Kafka and RabbitMQ topic rules).
const DefaultPoisonTopic = "wmonce.poison"

// poisonQueue returns the Stack's poison queue, nil with DisableParking.
func poisonQueue(config StackConfig) (message.HandlerMiddleware, error) {
	if config.DisableParking {
		return nil, nil
	}
	topic := cmp.Or(config.PoisonTopic, DefaultPoisonTopic)
	pub := config.PoisonPublisher
	if pub == nil {
		mw := config.Middleware
		if err := mw.step.Outbox.CheckTopic(topic); err != nil {
			return nil, fmt.Errorf("stack: PoisonTopic: %w", err)
		}
		pub = mw.step.Outbox.ParkingPublisher(mw.db)
	} else if err := outbox.DefaultValidateTopic(topic); err != nil {
		return nil, fmt.Errorf("stack: PoisonTopic: %w", err)
	} else if err := outboxops.CheckParking(pub); err != nil {
		return nil, fmt.Errorf("stack: PoisonPublisher: %w", err)
	}
	return wmiddleware.PoisonQueueWithFilter(parkingPublisher{pub, config.Logger}, topic, shouldParkOf(config))
}

// shouldParkOf is config.ShouldPark or its default.
func shouldParkOf(config StackConfig) func(error) bool {
	if config.ShouldPark != nil {
		return config.ShouldPark
	}
	return func(err error) bool { return wmonce.IsPermanent(err) || wmonce.IsPanic(err) }
}

// stackDelayedRetry is the Stack's delayed-retry step (delayed_retry.go): outside Retry, so
// that it sees what the immediate retries left, for the errors the poison queue does not park.
func stackDelayedRetry(config StackConfig) (*delayedRetry, error) {
	shouldPark := shouldParkOf(config)
	retryable := func(err error) bool { return !shouldPark(err) }
	if config.DisableParking {
		return newDelayedRetry(config.Middleware, config.DelayedRetries, retryable, nil, config.Logger), nil
	}
	exhausted := config
	exhausted.ShouldPark = func(error) bool { return true }
	park, err := poisonQueue(exhausted)
	if err != nil {
		return nil, err
	}
	return newDelayedRetry(config.Middleware, config.DelayedRetries, retryable, park, config.Logger), nil
}

// parkingPublisher makes every message parkable before pub parks it, whatever pub is: a message
// whose missing id or binary metadata is the reason it cannot be processed must still be
// parkable, or it would be nacked forever (a parkable message passes through
// outbox.Writer.ParkingPublisher unchanged). It logs each message it parks: a parked message
// needs a person.
type parkingPublisher struct {
	pub    message.Publisher
	logger watermill.LoggerAdapter
}

func (p parkingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for i, m := range msgs {
		msgs[i] = outbox.Parkable(m)
	}
	err := p.pub.Publish(topic, msgs...)
	for _, m := range msgs {
		fields := watermill.LogFields{"message_uuid": m.UUID, "poison_topic": topic, "handler": m.Metadata.Get(wmiddleware.PoisonedHandlerKey)}
		if err != nil {
			p.logger.Error("Message could not be parked: nacked, to be redelivered", err, fields)
			continue
		}
		p.logger.Error("Message parked on the poison topic and acked: it needs a person", errors.New(m.Metadata.Get(wmiddleware.ReasonForPoisonedKey)), fields)
	}
	return err
}

func (p parkingPublisher) Close() error { return p.pub.Close() }
