package broker

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// The record layout of Debezium's Outbox Event Router as the connector of package outbox/cdc
// configures it: the event id in header debeziumHeaderID (the outbox's uuid column), the
// metadata as one JSON object in header debeziumHeaderMetadata, the payload as the raw value
// (BinaryDataConverter), the partition key as the record key; Debezium adds headers of its own,
// named with the prefix debeziumHeaderPrefix.
const (
	debeziumHeaderID       = "id"
	debeziumHeaderMetadata = "metadata"
	debeziumHeaderPrefix   = "__debezium"
)

// MetadataUnmarshalError says why a record could not be read back; its message has an empty
// UUID, which the effectively-once middleware parks instead of applying.
const MetadataUnmarshalError = "unmarshal_error"

// KafkaUnmarshaler reads the records of the Relay (with Watermill's unmarshaler) and of
// Debezium's Outbox Event Router alike: both give the message the producer stored, same UUID,
// so a switch between them needs no setting and its copies are deduplicated (docs/cdc.md).
type KafkaUnmarshaler struct {
	Watermill kafka.Unmarshaler
}

// Unmarshal implements kafka.Unmarshaler.
func (u KafkaUnmarshaler) Unmarshal(rec *sarama.ConsumerMessage) (*message.Message, error) {
	if isDebeziumRecord(rec) {
		return debeziumUnmarshaler{}.Unmarshal(rec)
	}
	return u.Watermill.Unmarshal(rec)
}

// debeziumHeaders reads a Debezium record's headers: the event id, the stored metadata's JSON
// (each "" when absent), and the other headers but Debezium's own.
func debeziumHeaders(rec *sarama.ConsumerMessage) (id, metadata string, extra message.Metadata) {
	extra = message.Metadata{}
	for _, h := range rec.Headers {
		switch k := string(h.Key); {
		case k == debeziumHeaderID:
			id = string(h.Value)
		case k == debeziumHeaderMetadata:
			metadata = string(h.Value)
		case !strings.HasPrefix(k, debeziumHeaderPrefix):
			extra.Set(k, string(h.Value))
		}
	}
	return id, metadata, extra
}

// storedMetadata decodes the metadata the outbox.Writer stored (a JSON object of strings; none
// or null: empty).
func storedMetadata(js string) (message.Metadata, error) {
	md := message.Metadata{}
	if js == "" || js == "null" {
		return md, nil
	}
	if err := json.Unmarshal([]byte(js), (*map[string]string)(&md)); err != nil {
		return nil, err
	}
	if md == nil { // " null " decodes to no map
		md = message.Metadata{}
	}
	return md, nil
}

// isDebeziumRecord: no Watermill UUID header, and headers of Debezium's own.
func isDebeziumRecord(rec *sarama.ConsumerMessage) bool {
	debezium := false
	for _, h := range rec.Headers {
		switch k := string(h.Key); {
		case k == kafka.UUIDHeaderKey:
			return false
		case strings.HasPrefix(k, debeziumHeaderPrefix):
			debezium = true
		}
	}
	return debezium
}

// debeziumUnmarshaler turns a record of Debezium's Outbox Event Router back into the message the
// outbox.Writer stored: the UUID from header "id", the metadata (correlation, causation, trace
// context, partition key, ...) from the JSON of header "metadata", the payload byte for byte.
// Debezium's own headers (__debezium.*) are left out. Other headers (more columns placed as
// headers) become metadata the stored metadata does not already hold.
//
// A record without an id, or with metadata that is not a JSON object of strings, is not
// refused with an error (watermill-kafka stops consuming the partition on one): it becomes a
// message with an empty UUID and MetadataUnmarshalError, which the effectively-once
// middleware refuses as a message without a key, so it is parked, never applied.
type debeziumUnmarshaler struct{}

// Unmarshal implements kafka.Unmarshaler.
func (debeziumUnmarshaler) Unmarshal(rec *sarama.ConsumerMessage) (*message.Message, error) {
	id, md, extra := debeziumHeaders(rec)
	payload := rec.Value
	if payload == nil {
		payload = []byte{}
	}
	msg := message.NewMessage(id, payload)
	fail := func(reason string) (*message.Message, error) {
		msg.UUID = ""
		msg.Metadata = extra
		msg.Metadata.Set(MetadataUnmarshalError, fmt.Sprintf("broker: Debezium record at %s/%d/%d: %s", rec.Topic, rec.Partition, rec.Offset, reason))
		return msg, nil
	}
	if id == "" {
		return fail(`no "id" header: is the router's table.field.event.id the outbox's uuid column?`)
	}
	var err error
	if msg.Metadata, err = storedMetadata(md); err != nil {
		return fail(fmt.Sprintf(`"metadata" header is not a JSON object of strings: %v`, err))
	}
	for k, v := range extra {
		if _, ok := msg.Metadata[k]; !ok {
			msg.Metadata[k] = v
		}
	}
	return msg, nil
}
