package once

import (
	"encoding/base64"
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/oncetype"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmonce/watermill-once/outbox"
)

// StackConfig configures Stack.
type StackConfig struct {
	// Middleware is the transactional dedupe middleware. Required.
	Middleware *Middleware

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
	// Permanent(err) from the handler, output without topic or that cannot be stored) and panics.
	// A parked message the outbox cannot store as it is (no UUID, a UUID or metadata that is not
	// valid UTF-8 text) is made storable first and marked: see MetadataUUIDMissing,
	// MetadataUUIDOriginalBase64 and MetadataBase64Keys. Transient errors are
	// retried, then nacked for redelivery: a database outage must not park every message.
	ShouldPark func(err error) bool

	Logger watermill.LoggerAdapter
}

// Stack returns the recommended middlewares around the effectively-once middleware, outermost
// first, for router.AddMiddleware or handler.AddMiddleware:
//
//	Timeout -> Retry -> PoisonQueue -> Middleware -> CorrelationID -> Recoverer -> handler
//
// Retry is outside the transaction so each attempt is a new transaction. The poison queue is
// inside Retry, parking only what ShouldPark selects, so permanent failures are parked at once
// while transient ones are retried. CorrelationID and Recoverer are inside the transaction so
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
		if oncetype.IsPermanent(p.Err) {
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
			shouldPark = func(err error) bool { return oncetype.IsPermanent(err) || oncetype.IsPanic(err) }
		}
		poison, err := wmiddleware.PoisonQueueWithFilter(identifyingPublisher{config.PoisonPublisher}, config.PoisonTopic, shouldPark)
		if err != nil {
			return nil, err
		}
		stack = append(stack, poison)
	}
	stack = append(stack,
		config.Middleware.Middleware,
		wmiddleware.CorrelationID,
		wmiddleware.Recoverer,
	)
	return stack, nil
}

// MetadataUUIDMissing marks a parked message that arrived without a UUID and was given one so
// that it could be stored and found.
const MetadataUUIDMissing = "uuid_missing"

// MetadataUUIDOriginalBase64 holds, base64-encoded, the UUID of a parked message whose UUID could
// not be stored as it was (not valid UTF-8 text, or longer than outbox.MaxUUIDLength); the
// parked copy gets a fresh UUID.
const MetadataUUIDOriginalBase64 = "uuid_original_base64"

// MetadataBase64Keys lists (comma-separated, sorted) the metadata keys of a parked message whose
// values were base64-encoded because they were not valid UTF-8 text; a key that was not valid
// text itself is stored as "base64:" followed by its base64 encoding.
const MetadataBase64Keys = "metadata_base64_keys"

// identifyingPublisher makes a message the outbox cannot store as it is storable before parking
// it, and says so in its metadata: a message whose missing id or binary metadata is the reason it
// cannot be processed must still be parkable, or it would be nacked forever.
type identifyingPublisher struct{ message.Publisher }

func (p identifyingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for i, m := range msgs {
		if c, changed := parkable(m); changed {
			msgs[i] = c
		}
	}
	return p.Publisher.Publish(topic, msgs...)
}

func parkable(m *message.Message) (*message.Message, bool) {
	badUUID := m.UUID == "" || len(m.UUID) > outbox.MaxUUIDLength || !oncetype.IsText(m.UUID)
	var badKeys []string
	for k, v := range m.Metadata {
		if !oncetype.IsText(k) || !oncetype.IsText(v) {
			badKeys = append(badKeys, k)
		}
	}
	if !badUUID && len(badKeys) == 0 {
		return m, false
	}
	c := m.Copy()
	c.SetContext(m.Context())
	if badUUID {
		if m.UUID == "" {
			c.Metadata.Set(MetadataUUIDMissing, "true")
		} else {
			c.Metadata.Set(MetadataUUIDOriginalBase64, base64.StdEncoding.EncodeToString([]byte(m.UUID)))
		}
		c.UUID = watermill.NewUUID()
	}
	if len(badKeys) > 0 {
		var names []string
		for _, k := range badKeys {
			v := c.Metadata[k]
			delete(c.Metadata, k)
			name := k
			if !oncetype.IsText(k) {
				name = "base64:" + base64.StdEncoding.EncodeToString([]byte(k))
			}
			c.Metadata[name] = base64.StdEncoding.EncodeToString([]byte(v))
			names = append(names, name)
		}
		sort.Strings(names)
		c.Metadata.Set(MetadataBase64Keys, strings.Join(names, ","))
	}
	return c, true
}
