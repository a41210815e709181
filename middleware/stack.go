package middleware

import (
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// StackConfig configures Stack.
type StackConfig struct {
	// EffectivelyOnce is the transactional dedupe middleware. Required.
	EffectivelyOnce *EffectivelyOnce

	// Timeout bounds each delivery, retries included. Zero: no timeout.
	Timeout time.Duration

	// Retry re-runs a failed delivery, each attempt in a new transaction. MaxRetries defaults
	// to 3 and InitialInterval to 100ms; ResetContextOnRetry is always on (a failed PostgreSQL
	// transaction cannot be reused), and permanent errors are never retried.
	Retry wmiddleware.Retry

	// PoisonPublisher and PoisonTopic park messages for which ShouldPark is true: the message
	// is published there (with Watermill's reason_poisoned, topic_poisoned, handler_poisoned
	// metadata) and acked, so it stops blocking its partition or queue. Use
	// outbox.Writer.DBPublisher to park into PostgreSQL, from where the relay forwards it.
	// Without a PoisonPublisher nothing is parked: errors nack and the broker redelivers.
	PoisonPublisher message.Publisher
	PoisonTopic     string
	// ShouldPark decides which errors park a message. Default: permanent errors (bad key,
	// Permanent(err) from the handler, output without topic) and panics. Transient errors are
	// retried, then nacked for redelivery: a database outage must not park every message.
	ShouldPark func(err error) bool

	Logger watermill.LoggerAdapter
}

// Stack returns the recommended middlewares around the effectively-once middleware, outermost
// first, for router.AddMiddleware or handler.AddMiddleware:
//
//	Timeout -> Retry -> PoisonQueue -> EffectivelyOnce -> CorrelationID -> Recoverer -> handler
//
// Retry is outside the transaction so each attempt is a new transaction. The poison queue is
// inside Retry, parking only what ShouldPark selects, so permanent failures are parked at once
// while transient ones are retried. CorrelationID and Recoverer are inside the transaction so
// that produced messages carry correlation ids into the outbox and a panic rolls back.
//
// Do not add Watermill's InstantAck or Deduplicator to the same handler: the first acks before
// the commit, the second records keys before the handler succeeds and loses failed messages.
func Stack(config StackConfig) ([]message.HandlerMiddleware, error) {
	if config.EffectivelyOnce == nil {
		return nil, errors.New("stack: EffectivelyOnce is required: create it with NewEffectivelyOnce")
	}
	if config.Timeout < 0 {
		return nil, errors.New("stack: Timeout must not be negative")
	}
	if (config.PoisonPublisher == nil) != (config.PoisonTopic == "") {
		return nil, errors.New("stack: set both PoisonPublisher and PoisonTopic, or neither")
	}
	if config.Logger == nil {
		config.Logger = watermill.NopLogger{}
	}
	retry := config.Retry
	if retry.MaxRetries == 0 {
		retry.MaxRetries = 3
	}
	if retry.InitialInterval == 0 {
		retry.InitialInterval = 100 * time.Millisecond
	}
	if retry.Multiplier == 0 {
		retry.Multiplier = 2
	}
	if retry.MaxInterval == 0 {
		retry.MaxInterval = 5 * time.Second
	}
	if retry.Logger == nil {
		retry.Logger = config.Logger
	}
	retry.ResetContextOnRetry = true
	userShouldRetry := retry.ShouldRetry
	retry.ShouldRetry = func(p wmiddleware.RetryParams) bool {
		if IsPermanent(p.Err) {
			return false
		}
		return userShouldRetry == nil || userShouldRetry(p)
	}

	var stack []message.HandlerMiddleware
	if config.Timeout > 0 {
		stack = append(stack, wmiddleware.Timeout(config.Timeout))
	}
	stack = append(stack, retry.Middleware)
	if config.PoisonPublisher != nil {
		shouldPark := config.ShouldPark
		if shouldPark == nil {
			shouldPark = func(err error) bool { return IsPermanent(err) || IsPanic(err) }
		}
		poison, err := wmiddleware.PoisonQueueWithFilter(identifyingPublisher{config.PoisonPublisher}, config.PoisonTopic, shouldPark)
		if err != nil {
			return nil, err
		}
		stack = append(stack, poison)
	}
	stack = append(stack,
		config.EffectivelyOnce.Middleware,
		wmiddleware.CorrelationID,
		wmiddleware.Recoverer,
	)
	return stack, nil
}

// MetadataUUIDMissing marks a parked message that arrived without a UUID and was given one so
// that it could be stored and found.
const MetadataUUIDMissing = "uuid_missing"

// identifyingPublisher gives a message without a UUID a fresh one before parking it: a message
// whose missing id is the reason it cannot be processed must still be parkable.
type identifyingPublisher struct{ message.Publisher }

func (p identifyingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for i, m := range msgs {
		if m.UUID == "" {
			c := m.Copy()
			c.UUID = watermill.NewUUID()
			c.Metadata.Set(MetadataUUIDMissing, "true")
			c.SetContext(m.Context())
			msgs[i] = c
		}
	}
	return p.Publisher.Publish(topic, msgs...)
}
