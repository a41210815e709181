package outbox

import (
	"cmp"
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// Metadata keys the Writer stamps on every message it stores, unless the producer set them:
// correlation (inherited from the consumed message, else the message's own UUID), causation
// (the consumed message's UUID) and occurred_at (RFC 3339, UTC; stable across copies, for age
// checks). MetadataEventType, when set by the producer, is also stored in the type column
// Debezium's router reads.
const (
	MetadataCorrelationID = middleware.CorrelationIDMetadataKey
	MetadataCausationID   = "causation_id"
	MetadataOccurredAt    = "occurred_at"
	MetadataEventType     = "event_type"
)

// defaultPartitionKeyField is the default of Config.PartitionKeyField: the same metadata field
// the broker package keys Kafka records by (broker.KafkaConfig.PartitionKeyField's default).
const defaultPartitionKeyField = "partition_key"

// stamp sets the correlation, causation and occurred_at metadata msg does not carry yet:
// correlation from cause (the consumed message; nil: none, and msg starts a chain), causation
// cause's UUID, occurred_at now.
func stamp(msg *message.Message, cause *message.Message, now string) {
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	correlation := msg.UUID
	if cause != nil {
		correlation = cmp.Or(cause.Metadata.Get(MetadataCorrelationID), cause.UUID)
		setUnset(msg.Metadata, MetadataCausationID, cause.UUID)
	}
	setUnset(msg.Metadata, MetadataCorrelationID, correlation)
	setUnset(msg.Metadata, MetadataOccurredAt, now)
}

// setUnset sets key to value unless md already carries a value for it: the producer's own wins.
func setUnset(md message.Metadata, key, value string) {
	if md.Get(key) == "" {
		md.Set(key, value)
	}
}

type consumedKey struct{}

// ContextWithConsumed records the message being consumed, whose UUID and correlation_id the
// messages stored from ctx inherit; the middleware and the inbox Processor call it, custom
// consumers may.
func ContextWithConsumed(ctx context.Context, consumed *message.Message) context.Context {
	return context.WithValue(ctx, consumedKey{}, consumed)
}

// ConsumedFromContext returns the message recorded by ContextWithConsumed.
func ConsumedFromContext(ctx context.Context) (*message.Message, bool) {
	m, ok := ctx.Value(consumedKey{}).(*message.Message)
	return m, ok && m != nil
}
