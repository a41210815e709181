package outbox

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// Metadata keys the Writer stamps on every message it stores.
const (
	// MetadataCorrelationID is Watermill's correlation key: kept if set, otherwise inherited
	// from the consumed message, otherwise the message's own UUID (it starts a chain).
	MetadataCorrelationID = middleware.CorrelationIDMetadataKey
	// MetadataCausationID names the UUID of the consumed message that caused this one.
	MetadataCausationID = "causation_id"
	// MetadataOccurredAt is when the event occurred (RFC 3339, UTC), kept if the producer set
	// it. It is stable across every copy of the message, which makes it usable for age checks
	// and for choosing time partitions.
	MetadataOccurredAt = "occurred_at"
	// MetadataEventType, when set, is stored in the outbox's type column too (migration 013):
	// Debezium's Outbox Event Router can place it in a header or route by it. The Writer does
	// not stamp it.
	MetadataEventType = "event_type"
)

// defaultPartitionKeyField is the default of Config.PartitionKeyField: the same metadata field
// the broker package keys Kafka records by (broker.KafkaConfig.PartitionKeyField's default).
const defaultPartitionKeyField = "partition_key"

// stamp sets the correlation, causation and occurred_at metadata msg does not carry yet:
// causation from cause, the consumed message (nil: none), occurred_at to now.
func stamp(msg *message.Message, cause *message.Message, now string) {
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	if msg.Metadata.Get(MetadataCorrelationID) == "" {
		corr := msg.UUID
		if cause != nil {
			if c := cause.Metadata.Get(MetadataCorrelationID); c != "" {
				corr = c
			} else {
				corr = cause.UUID
			}
		}
		msg.Metadata.Set(MetadataCorrelationID, corr)
	}
	if cause != nil && msg.Metadata.Get(MetadataCausationID) == "" {
		msg.Metadata.Set(MetadataCausationID, cause.UUID)
	}
	if msg.Metadata.Get(MetadataOccurredAt) == "" {
		msg.Metadata.Set(MetadataOccurredAt, now)
	}
}

type consumedKey struct{}

// ContextWithConsumed records the message being consumed, so that messages stored from this
// context carry its UUID as causation_id and inherit its correlation_id. The effectively-once
// middleware and the inbox processor call it; call it yourself in custom consumers.
func ContextWithConsumed(ctx context.Context, consumed *message.Message) context.Context {
	return context.WithValue(ctx, consumedKey{}, consumed)
}

// ConsumedFromContext returns the message recorded by ContextWithConsumed.
func ConsumedFromContext(ctx context.Context) (*message.Message, bool) {
	m, ok := ctx.Value(consumedKey{}).(*message.Message)
	return m, ok && m != nil
}
