package outbox

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/setup"
)

// Markers on a parked copy that Parkable had to change (see Parkable). RecoverParked reads them
// back.
const (
	// MetadataUUIDMissing is "true" on the parked copy of a message that had no UUID; the copy
	// has a fresh one.
	MetadataUUIDMissing = "uuid_missing"
	// MetadataUUIDOriginalBase64 holds, in standard base64, the UUID of a message whose UUID
	// could not be stored as it was (longer than MaxUUIDLength, not valid UTF-8, or holding
	// NUL); the copy has a fresh one.
	MetadataUUIDOriginalBase64 = "uuid_original_base64"
	// MetadataBase64Keys lists, as a JSON array of strings, the metadata entries of the copy
	// whose values are the standard base64 of the original values. A listed entry whose name
	// starts with Base64KeyPrefix holds an original key that could not stay as it was: the rest
	// of the name is that key in standard base64.
	MetadataBase64Keys = "metadata_base64_keys"
)

// Base64KeyPrefix starts the name of a listed metadata entry whose original key is encoded
// (see MetadataBase64Keys).
const Base64KeyPrefix = "base64:"

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

// Parkable returns msg in a form every part of the path to a poison topic accepts: the outbox
// (UUID and metadata as text), the relay and the brokers it forwards to. It is msg itself when
// msg already is in that form (the common case), otherwise a copy with msg's context, changed
// as follows and marked so that RecoverParked can restore the original exactly:
//
//   - a missing UUID is replaced by a fresh one (marked MetadataUUIDMissing); a UUID longer
//     than MaxUUIDLength, not valid UTF-8 or holding NUL is replaced by a fresh one and kept
//     in MetadataUUIDOriginalBase64;
//   - a metadata entry whose key or value is not valid UTF-8 text without NUL, or whose key a
//     broker refuses (_watermill_message_uuid, reserved by Watermill's marshalers; CC and BCC,
//     which RabbitMQ takes for routing), has its value base64-encoded, and its key too when the
//     key itself is the problem; the entries so encoded are listed in MetadataBase64Keys. In a
//     copy that is changed, entries that would be mistaken for markers (the three marker keys,
//     keys starting with Base64KeyPrefix) are encoded the same way, so that nothing is
//     ambiguous.
//
// The payload is never changed: the outbox stores any bytes. A message that is parked a second
// time (its parked copy refused again) and needs no change keeps its markers; one that needs a
// change gets its markers encoded like any other entry, and RecoverParked peels one layer.
// Parkable never fails and never drops anything: it is what makes every refused message
// parkable, so that it stops blocking its partition or queue.
func Parkable(msg *message.Message) *message.Message {
	if msg == nil || parkableAsIs(msg) {
		return msg
	}
	c := msg.Copy()
	c.SetContext(msg.Context())
	// A new map: encoded names never collide with kept ones (kept keys are plain, encoded
	// names are either the same plain key or start with Base64KeyPrefix).
	c.Metadata = make(message.Metadata, len(msg.Metadata)+2)
	var names []string
	for k, v := range msg.Metadata {
		if !mustEncode(k, v) {
			c.Metadata[k] = v
			continue
		}
		name := k
		if !plainKey(k) {
			name = Base64KeyPrefix + base64.StdEncoding.EncodeToString([]byte(k))
		}
		c.Metadata[name] = base64.StdEncoding.EncodeToString([]byte(v))
		names = append(names, name)
	}
	if len(names) > 0 {
		sort.Strings(names)
		list, _ := json.Marshal(names) // strings only: cannot fail
		c.Metadata[MetadataBase64Keys] = string(list)
	}
	if !storableUUID(msg.UUID) {
		if msg.UUID == "" {
			c.Metadata[MetadataUUIDMissing] = "true"
		} else {
			c.Metadata[MetadataUUIDOriginalBase64] = base64.StdEncoding.EncodeToString([]byte(msg.UUID))
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
	case MetadataUUIDMissing, MetadataUUIDOriginalBase64, MetadataBase64Keys:
		return false
	}
	return setup.IsText(k) && !reservedKey(k) && !strings.HasPrefix(k, Base64KeyPrefix)
}

// ErrNotParked is wrapped by RecoverParked's error for markers it cannot read: the message was
// not made parkable by Parkable, or its markers were altered.
var ErrNotParked = errors.New("outbox: not a parked copy made by Parkable")

// RecoverParked returns the message that Parkable was given, from its parked copy as read back
// from the outbox or from the poison topic: the original UUID (empty when it was missing), the
// original metadata (every encoded entry decoded, the markers removed) and the payload, in a
// new message with parked's context. A copy without markers (one Parkable returned unchanged)
// comes back as a plain copy.
//
// What the parked copy holds besides the original is kept: the reasons Watermill's poison queue
// adds (reason_poisoned, topic_poisoned, handler_poisoned, subscriber_poisoned, set on the
// message before it reaches the publisher) and whatever the broker adds on the way out of the
// poison topic. Writer.ParkingPublisher adds nothing else.
func RecoverParked(parked *message.Message) (*message.Message, error) {
	if parked == nil {
		return nil, errors.New("outbox: RecoverParked: message is nil")
	}
	m := parked.Copy()
	m.SetContext(parked.Context())
	if m.Metadata == nil {
		m.Metadata = message.Metadata{}
	}
	if v, ok := m.Metadata[MetadataUUIDMissing]; ok {
		if v != "true" {
			return nil, fmt.Errorf("%w: %s is %q, not \"true\"", ErrNotParked, MetadataUUIDMissing, v)
		}
		delete(m.Metadata, MetadataUUIDMissing)
		m.UUID = ""
	}
	if v, ok := m.Metadata[MetadataUUIDOriginalBase64]; ok {
		uuid, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrNotParked, MetadataUUIDOriginalBase64, err)
		}
		delete(m.Metadata, MetadataUUIDOriginalBase64)
		m.UUID = string(uuid)
	}
	list, ok := m.Metadata[MetadataBase64Keys]
	if !ok {
		return m, nil
	}
	var names []string
	if err := json.Unmarshal([]byte(list), &names); err != nil {
		return nil, fmt.Errorf("%w: %s is not a JSON array of strings: %w", ErrNotParked, MetadataBase64Keys, err)
	}
	delete(m.Metadata, MetadataBase64Keys)
	decoded := make(message.Metadata, len(names))
	for _, name := range names {
		v, ok := m.Metadata[name]
		if !ok {
			return nil, fmt.Errorf("%w: %s lists %q, which the message does not hold", ErrNotParked, MetadataBase64Keys, name)
		}
		value, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, fmt.Errorf("%w: value of %q: %w", ErrNotParked, name, err)
		}
		key := name
		if enc, ok := strings.CutPrefix(name, Base64KeyPrefix); ok {
			k, err := base64.StdEncoding.DecodeString(enc)
			if err != nil {
				return nil, fmt.Errorf("%w: key %q: %w", ErrNotParked, name, err)
			}
			key = string(k)
		}
		delete(m.Metadata, name)
		decoded[key] = string(value)
	}
	for k, v := range decoded {
		m.Metadata[k] = v
	}
	return m, nil
}
