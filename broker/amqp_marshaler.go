package broker

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net/url"
	"time"
	"unicode/utf8"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Marshaler converts between Watermill messages and AMQP. It writes what Watermill's
// DefaultMarshaler writes (persistent delivery, metadata as string headers, the UUID in header
// _watermill_message_uuid), and reads any header type.
//
// Watermill's DefaultMarshaler refuses a delivery with a non-string header. RabbitMQ adds such
// headers itself: x-delivery-count (a number, on redeliveries from quorum queues) and x-death
// (an array of tables, after dead-lettering). The refusal makes the subscriber nack, RabbitMQ
// requeues at once, and the message loops forever. This Marshaler never refuses a delivery:
// strings are kept, numbers and booleans are formatted, timestamps become RFC 3339 (UTC),
// byte arrays are kept as text when they are UTF-8 and base64 otherwise, decimals become their
// decimal text, and tables and arrays become JSON with the same conversions inside.
type Marshaler struct {
	wamqp.DefaultMarshaler
}

// Unmarshal never fails: a message without a UUID header gets an empty UUID, which the
// effectively-once middleware refuses as an unusable key (parked, not applied) rather than
// looping here.
func (m Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	uuidKey := m.MessageUUIDHeaderKey
	if uuidKey == "" {
		uuidKey = wamqp.DefaultMessageUUIDHeaderKey
	}
	var uuid string
	if v, ok := d.Headers[uuidKey]; ok {
		uuid = HeaderString(v)
	}
	msg := message.NewMessage(uuid, d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers))
	for k, v := range d.Headers {
		if k == uuidKey {
			continue
		}
		msg.Metadata[k] = HeaderString(v)
	}
	return msg, nil
}

// HeaderString renders an AMQP header value (any type amqp091 decodes) as metadata text.
func HeaderString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	case []byte:
		return bytesString(v)
	case bool, int, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64:
		return fmt.Sprint(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case amqp.Decimal:
		return decimalString(v)
	}
	b, err := json.Marshal(jsonable(v))
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(b)
}

// jsonable converts nested tables and arrays so that encoding/json renders them like HeaderString.
func jsonable(v any) any {
	switch v := v.(type) {
	case amqp.Table:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = jsonable(x)
		}
		return out
	case map[string]any:
		return jsonable(amqp.Table(v))
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = jsonable(x)
		}
		return out
	case []byte:
		return bytesString(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case amqp.Decimal:
		return decimalString(v)
	}
	return v
}

func bytesString(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return "base64:" + base64.StdEncoding.EncodeToString(b)
}

func decimalString(d amqp.Decimal) string {
	r := new(big.Rat).SetFrac(big.NewInt(int64(d.Value)), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale)), nil))
	return r.FloatString(int(d.Scale))
}

// redactURL drops the password from a URL for error messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
