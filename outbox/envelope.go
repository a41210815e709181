package outbox

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// envelope is the row payload: the format of Watermill's components/forwarder, so that
// Watermill's own forwarder can also read an outbox written here.
type envelope struct {
	DestinationTopic string            `json:"destination_topic"`
	UUID             string            `json:"uuid"`
	Payload          []byte            `json:"payload"`
	Metadata         map[string]string `json:"metadata"`
}

func marshalEnvelope(topic string, msg *message.Message) []byte {
	// Strings, bytes and a map of strings: encoding cannot fail.
	b, _ := json.Marshal(envelope{
		DestinationTopic: topic,
		UUID:             msg.UUID,
		Payload:          msg.Payload,
		Metadata:         msg.Metadata,
	})
	return b
}

// unmarshalEnvelope decodes a row payload back into its destination and message.
func unmarshalEnvelope(raw []byte) (string, *message.Message, error) {
	var e envelope
	if err := json.Unmarshal(raw, &e); err != nil {
		return "", nil, fmt.Errorf("not a forwarder envelope: %w", err)
	}
	if e.DestinationTopic == "" {
		return "", nil, errors.New("envelope has no destination_topic")
	}
	if e.UUID == "" {
		return "", nil, errors.New("envelope has no uuid")
	}
	msg := message.NewMessage(e.UUID, e.Payload)
	if e.Metadata != nil {
		msg.Metadata = e.Metadata
	}
	return e.DestinationTopic, msg, nil
}
