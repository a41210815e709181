package outbox

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/setup"
)

// Markers on a parked copy that Parkable had to change; RecoverParked reads them back
// (docs/outbox-relay.md, Parking):
//   - uuid_missing is "true" when the message had no UUID (the copy has a fresh one);
//   - uuid_original_base64 holds the standard base64 of a UUID that could not be stored;
//   - metadata_base64_keys lists, as a JSON array, the entries whose values are the standard
//     base64 of the original ones; a listed name starting with "base64:" is an encoded key.
const (
	markerUUIDMissing        = "uuid_missing"
	markerUUIDOriginalBase64 = "uuid_original_base64"
	markerBase64Keys         = "metadata_base64_keys"
	base64KeyPrefix          = "base64:"
)

// reservedKey reports whether a broker refuses or overwrites a metadata key: the header in which
// watermill-kafka and watermill-amqp carry the UUID (Watermill's Kafka marshaler refuses a
// message whose metadata holds it, the AMQP one overwrites it), and RabbitMQ's sender-selected
// distribution headers CC and BCC (it nacks a publish whose CC or BCC is a string, as metadata
// always is). As a metadata key of a parked copy it would block the relay or be lost.
func reservedKey(k string) bool {
	switch k {
	case "_watermill_message_uuid", "CC", "BCC":
		return true
	}
	return false
}

// Parkable returns msg in a form every part of the path to a poison topic accepts: the outbox,
// the relay and the brokers it forwards to. It is msg itself when msg already is in that form
// (the common case), otherwise a copy with msg's context in which a missing or unstorable UUID
// is replaced by a fresh one, and metadata entries that are not text or whose key a broker
// refuses (_watermill_message_uuid, CC, BCC) are base64-encoded, each change marked so that
// RecoverParked restores the original exactly. The payload is never changed. Parkable never
// fails and never drops anything: it is what makes every refused message parkable, so that it
// stops blocking its partition or queue.
func Parkable(msg *message.Message) *message.Message {
	if msg == nil || parkableAsIs(msg) {
		return msg
	}
	c := msg.Copy()
	c.SetContext(msg.Context())
	c.Metadata = encodedMetadata(msg.Metadata)
	if !storableUUID(msg.UUID) {
		if msg.UUID == "" {
			c.Metadata[markerUUIDMissing] = "true"
		} else {
			c.Metadata[markerUUIDOriginalBase64] = base64.StdEncoding.EncodeToString([]byte(msg.UUID))
		}
		c.UUID = parkedUUID(msg)
	}
	return c
}

// parkedUUID is the UUID of a parked copy whose own UUID cannot be stored: derived from what the
// refused message carried (its UUID bytes, payload, and where Watermill's poison queue says it was
// refused), so that a redelivered copy parked again gets the same UUID and a consumer of the
// poison topic can deduplicate them. A version 8 (custom) UUID, 36 characters like any other.
func parkedUUID(msg *message.Message) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(msg.UUID), msg.Payload, []byte(msg.Metadata.Get("topic_poisoned")), []byte(msg.Metadata.Get("handler_poisoned"))} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// encodedMetadata returns md for a changed parked copy: every entry that must be encoded is
// base64-encoded (its key too when the key is not plain) and listed in the marker. A new map:
// encoded names never collide with kept ones (kept keys are plain, encoded names are either
// the same plain key or start with base64KeyPrefix).
func encodedMetadata(md message.Metadata) message.Metadata {
	out := make(message.Metadata, len(md)+2)
	var names []string
	for k, v := range md {
		if !mustEncode(k, v) {
			out[k] = v
			continue
		}
		name := k
		if !plainKey(k) {
			name = base64KeyPrefix + base64.StdEncoding.EncodeToString([]byte(k))
		}
		out[name] = base64.StdEncoding.EncodeToString([]byte(v))
		names = append(names, name)
	}
	if len(names) > 0 {
		sort.Strings(names)
		list, _ := json.Marshal(names) // strings only: cannot fail
		out[markerBase64Keys] = string(list)
	}
	return out
}

// parkableAsIs reports whether msg needs no change: a storable UUID, and no metadata entry
// that is not text or uses the reserved key.
func parkableAsIs(msg *message.Message) bool {
	if !storableUUID(msg.UUID) {
		return false
	}
	for k, v := range msg.Metadata {
		if !setup.IsText(k) || !setup.IsText(v) || reservedKey(k) {
			return false
		}
	}
	return true
}

func storableUUID(uuid string) bool {
	return uuid != "" && len(uuid) <= MaxUUIDLength && setup.IsText(uuid)
}

// mustEncode reports whether the entry is encoded in a copy that Parkable changes.
func mustEncode(k, v string) bool { return !setup.IsText(v) || !plainKey(k) }

// plainKey reports whether k can name an entry of a changed copy as it is: text, not reserved,
// and not mistakable for a marker or an encoded key.
func plainKey(k string) bool {
	switch k {
	case markerUUIDMissing, markerUUIDOriginalBase64, markerBase64Keys:
		return false
	}
	return setup.IsText(k) && !reservedKey(k) && !strings.HasPrefix(k, base64KeyPrefix)
}

// ErrNotParked is wrapped by RecoverParked's error for markers it cannot read.
var ErrNotParked = errors.New("outbox: not a parked copy made by Parkable")

// RecoverParked returns the message that Parkable was given, from its parked copy read back
// from the outbox or the poison topic: the original UUID (empty when it was missing), metadata
// and payload, in a new message with parked's context. What was added on the way (the poison
// queue's reasons, broker headers) is kept.
func RecoverParked(parked *message.Message) (*message.Message, error) {
	if parked == nil {
		return nil, errors.New("outbox: RecoverParked: message is nil")
	}
	m := parked.Copy()
	m.SetContext(parked.Context())
	if m.Metadata == nil {
		m.Metadata = message.Metadata{}
	}
	if err := recoverUUID(m); err != nil {
		return nil, err
	}
	if err := decodeEntries(m.Metadata); err != nil {
		return nil, err
	}
	return m, nil
}

// recoverUUID gives m back the UUID its markers say the original had, and removes them.
func recoverUUID(m *message.Message) error {
	if v, ok := m.Metadata[markerUUIDMissing]; ok {
		if v != "true" {
			return fmt.Errorf("%w: %s is %q, not \"true\"", ErrNotParked, markerUUIDMissing, v)
		}
		m.UUID = ""
	}
	if v, ok := m.Metadata[markerUUIDOriginalBase64]; ok {
		uuid, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrNotParked, markerUUIDOriginalBase64, err)
		}
		m.UUID = string(uuid)
	}
	delete(m.Metadata, markerUUIDMissing)
	delete(m.Metadata, markerUUIDOriginalBase64)
	return nil
}

// decodeEntries decodes, in md, the entries its list marker names (keys too, where encoded),
// and removes the marker.
func decodeEntries(md message.Metadata) error {
	list, ok := md[markerBase64Keys]
	if !ok {
		return nil
	}
	var names []string
	if err := json.Unmarshal([]byte(list), &names); err != nil {
		return fmt.Errorf("%w: %s is not a JSON array of strings: %w", ErrNotParked, markerBase64Keys, err)
	}
	delete(md, markerBase64Keys)
	decoded := make(message.Metadata, len(names))
	for _, name := range names {
		v, ok := md[name]
		if !ok {
			return fmt.Errorf("%w: %s lists %q, which the message does not hold", ErrNotParked, markerBase64Keys, name)
		}
		value, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return fmt.Errorf("%w: value of %q: %w", ErrNotParked, name, err)
		}
		key := name
		if enc, ok := strings.CutPrefix(name, base64KeyPrefix); ok {
			k, err := base64.StdEncoding.DecodeString(enc)
			if err != nil {
				return fmt.Errorf("%w: key %q: %w", ErrNotParked, name, err)
			}
			key = string(k)
		}
		delete(md, name)
		decoded[key] = string(value)
	}
	maps.Copy(md, decoded)
	return nil
}
