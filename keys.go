package wmonce

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrInvalidKey is wrapped by every error about a message's dedupe key. Such errors are also
// permanent (see IsPermanent): retrying the same message cannot fix its key.
var ErrInvalidKey = errors.New("wmonce: invalid dedupe key")

// KeyFunc returns a key of a message: its dedupe key (a component's Config.Key), or the inbox's
// ordering key (inbox.ReceiverConfig.OrderingKey). A dedupe key is a stable id the producer
// gives every copy of one event. Never use a broker delivery id (Kafka offset, AMQP delivery
// tag, SQS receipt handle): those change on redelivery and would let every copy through.
type KeyFunc func(msg *message.Message) (string, error)

// KeyFromUUID uses the Watermill message UUID, which watermill-once's outbox and Watermill's
// publishers carry unchanged through every broker. This is the default.
func KeyFromUUID() KeyFunc {
	return func(msg *message.Message) (string, error) {
		if msg.UUID == "" {
			return "", errors.New("message UUID is empty: producers must set a stable UUID, or configure Key (KeyFromMetadata, KeyFromPayloadSHA256 or a business key)")
		}
		return msg.UUID, nil
	}
}

// KeyFromMetadata uses a metadata field, e.g. "event_id" set by the producer. A message without
// the field is refused (a permanent error), never keyed "".
func KeyFromMetadata(field string) KeyFunc {
	return func(msg *message.Message) (string, error) {
		v := msg.Metadata.Get(field)
		if v == "" {
			return "", fmt.Errorf("metadata field %q is missing or empty: the producer must set it, or configure another key function", field)
		}
		return v, nil
	}
}

// KeyFromPayloadSHA256 uses the hex SHA-256 of the raw payload, for producers that send no id:
// byte-identical payloads are then one event.
func KeyFromPayloadSHA256() KeyFunc {
	return func(msg *message.Message) (string, error) {
		sum := sha256.Sum256(msg.Payload)
		return hex.EncodeToString(sum[:]), nil
	}
}

// KeyFromFunc adapts a business-key extractor (e.g. the payment id in the payload).
func KeyFromFunc(f func(msg *message.Message) (string, error)) KeyFunc { return f }
