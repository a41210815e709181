package broker_test

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
)

func record(value []byte, headers ...string) *sarama.ConsumerMessage {
	rec := &sarama.ConsumerMessage{Topic: "t", Partition: 1, Offset: 7, Value: value}
	for i := 0; i < len(headers); i += 2 {
		rec.Headers = append(rec.Headers, &sarama.RecordHeader{Key: []byte(headers[i]), Value: []byte(headers[i+1])})
	}
	return rec
}

// A record of Debezium's Outbox Event Router is read back into the stored message; a record
// the Relay published is read as before; one without an id becomes a message without a key,
// which the middleware parks, instead of an error that would stop the partition.
func TestKafkaUnmarshalerReadsRelayAndDebeziumRecords(t *testing.T) {
	u := broker.KafkaUnmarshaler{Watermill: kafka.DefaultMarshaler{}}
	payload := []byte{0xff, 0x00, 'a'}
	m, err := u.Unmarshal(record(payload, "id", "e-1", "metadata", `{"traceparent":"00-x-y-01","correlation_id":"c"}`,
		"__debezium.context.connectorName", "postgresql", "__debezium.context.taskId", "0", "extra", "v"))
	require.NoError(t, err)
	require.Equal(t, "e-1", m.UUID)
	require.Equal(t, payload, []byte(m.Payload))
	require.Equal(t, map[string]string{"traceparent": "00-x-y-01", "correlation_id": "c", "extra": "v"}, map[string]string(m.Metadata))

	m, err = u.Unmarshal(record([]byte("w"), kafka.UUIDHeaderKey, "w-1", "id", "business-id", "__debezium.x", "not debezium's: the Relay's"))
	require.NoError(t, err)
	require.Equal(t, "w-1", m.UUID, "a Watermill UUID header makes it the Relay's record")
	require.Equal(t, "business-id", m.Metadata.Get("id"))

	m, err = u.Unmarshal(record(nil, "__debezium.context.taskId", "0", "metadata", `{}`))
	require.NoError(t, err)
	require.Empty(t, m.UUID)
	require.Contains(t, m.Metadata.Get(broker.MetadataUnmarshalError), `t/1/7: no "id" header`)

	m, err = u.Unmarshal(record(nil, "__debezium.context.taskId", "0", "id", "e-2", "metadata", `{"n":1}`))
	require.NoError(t, err)
	require.Empty(t, m.UUID)
	require.Contains(t, m.Metadata.Get(broker.MetadataUnmarshalError), "not a JSON object of strings")
}
