package broker

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Metadata keys of the AMQP properties Marshaler.Unmarshal sets (only those set), for key
// functions such as wmonce.KeyFromMetadata(MetadataAMQPMessageID). Timestamp: RFC 3339, UTC.
const (
	MetadataAMQPMessageID       = "amqp_message_id"
	MetadataAMQPCorrelationID   = "amqp_correlation_id"
	MetadataAMQPTimestamp       = "amqp_timestamp"
	MetadataAMQPType            = "amqp_type"
	MetadataAMQPAppID           = "amqp_app_id"
	MetadataAMQPUserID          = "amqp_user_id"
	MetadataAMQPContentType     = "amqp_content_type"
	MetadataAMQPContentEncoding = "amqp_content_encoding"
	MetadataAMQPReplyTo         = "amqp_reply_to"
	MetadataAMQPExpiration      = "amqp_expiration"
	MetadataAMQPPriority        = "amqp_priority"
)

// Marshaler writes what Watermill's DefaultMarshaler writes plus the UUID as message-id, and
// reads any header type (RabbitMQ's x-death and x-delivery-count, which DefaultMarshaler
// refuses forever, become text) and the AMQP properties (MetadataAMQP... keys; a header of the
// same name wins).
type Marshaler struct {
	wamqp.DefaultMarshaler
}

// Marshal is DefaultMarshaler.Marshal with message-id set to the UUID.
func (m Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	pub, err := m.DefaultMarshaler.Marshal(msg)
	if err != nil {
		return pub, err
	}
	if pub.MessageId == "" {
		pub.MessageId = msg.UUID
	}
	return pub, nil
}

// Unmarshal never fails. The UUID is the UUID header, else message-id, else empty (which the
// effectively-once middleware parks).
func (m Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	uuidKey := cmp.Or(m.MessageUUIDHeaderKey, wamqp.DefaultMessageUUIDHeaderKey)
	uuid := cmp.Or(headerString(d.Headers[uuidKey]), bytesString([]byte(d.MessageId))) // a missing header is nil: ""
	msg := message.NewMessage(uuid, d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers))
	maps.Copy(msg.Metadata, amqpProperties(d))
	for k, v := range d.Headers {
		if k == uuidKey {
			continue
		}
		msg.Metadata[k] = headerString(v)
	}
	return msg, nil
}

// amqpProperties returns the set properties of d under their metadata keys. AMQP short
// strings are bytes: invalid UTF-8 is rendered like a binary header.
func amqpProperties(d amqp.Delivery) map[string]string {
	props := map[string]string{}
	text := func(key, v string) {
		if v != "" {
			props[key] = bytesString([]byte(v))
		}
	}
	text(MetadataAMQPMessageID, d.MessageId)
	text(MetadataAMQPCorrelationID, d.CorrelationId)
	text(MetadataAMQPType, d.Type)
	text(MetadataAMQPAppID, d.AppId)
	text(MetadataAMQPUserID, d.UserId)
	text(MetadataAMQPContentType, d.ContentType)
	text(MetadataAMQPContentEncoding, d.ContentEncoding)
	text(MetadataAMQPReplyTo, d.ReplyTo)
	text(MetadataAMQPExpiration, d.Expiration)
	if !d.Timestamp.IsZero() {
		props[MetadataAMQPTimestamp] = d.Timestamp.UTC().Format(time.RFC3339Nano)
	}
	if d.Priority != 0 {
		props[MetadataAMQPPriority] = strconv.Itoa(int(d.Priority))
	}
	return props
}

// headerString renders an AMQP header value (any type amqp091 decodes) as metadata text.
func headerString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	case []byte:
		return bytesString(v)
	case bool, int, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64:
		return fmt.Sprint(v)
	}
	if s, ok := scalarText(v); ok {
		return s
	}
	b, err := json.Marshal(jsonable(v))
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(b)
}

// jsonable converts nested tables and arrays so that encoding/json renders them like headerString.
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
	}
	if s, ok := scalarText(v); ok {
		return s
	}
	return v
}

// scalarText renders the header values that headerString and jsonable show as text rather than
// as Go or JSON prints them: bytes (UTF-8 or base64), times (RFC 3339, UTC), decimals.
func scalarText(v any) (string, bool) {
	switch v := v.(type) {
	case []byte:
		return bytesString(v), true
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano), true
	case amqp.Decimal:
		return decimalString(v), true
	}
	return "", false
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
