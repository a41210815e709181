package idemkey

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/setup"
)

// versionTag starts every hashed encoding. A future change of the encoding gets a new tag, so
// keys of different versions can never be equal by accident.
const versionTag = "watermill-once/idemkey/v1"

// MaxPartLength bounds each part of a key, in bytes (a longer one is a mistake).
const MaxPartLength = 4096

// ErrInvalidPart is wrapped by every error about a consumer, message id or step.
var ErrInvalidPart = errors.New("idemkey: invalid key part")

// Derive returns the key of one step of one message at one consumer: 64 lower-case hex
// characters, the same for the same parts everywhere and always. No part may be empty.
func Derive(consumer, messageID, step string) (string, error) {
	sum, err := digest(consumer, messageID, step)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(sum[:]), nil
}

// DeriveUUID returns Derive's key as an RFC 9562 version 8 UUID (122 bits of the hash).
func DeriveUUID(consumer, messageID, step string) (string, error) {
	sum, err := digest(consumer, messageID, step)
	if err != nil {
		return "", err
	}
	var u [16]byte
	copy(u[:], sum[:16])
	u[6] = (u[6] & 0x0f) | 0x80 // version 8: custom
	u[8] = (u[8] & 0x3f) | 0x80 // RFC 9562 variant
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], u[10:16])
	return string(b[:]), nil
}

func digest(consumer, messageID, step string) ([32]byte, error) {
	var errs []error
	for _, p := range [...]struct{ name, value string }{{"consumer", consumer}, {"message id", messageID}, {"step", step}} {
		switch {
		case p.value == "":
			errs = append(errs, fmt.Errorf("%w: %s is empty", ErrInvalidPart, p.name))
		case len(p.value) > MaxPartLength:
			errs = append(errs, fmt.Errorf("%w: %s is %d bytes long, over %d", ErrInvalidPart, p.name, len(p.value), MaxPartLength))
		default:
			if err := setup.CheckText(p.name, p.value); err != nil {
				errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidPart, err))
			}
		}
	}
	if len(errs) > 0 {
		return [32]byte{}, errors.Join(errs...)
	}
	h := sha256.New()
	buf := make([]byte, 0, len(versionTag)+len(consumer)+len(messageID)+len(step)+4*binary.MaxVarintLen64)
	for _, part := range [...]string{versionTag, consumer, messageID, step} {
		buf = binary.AppendUvarint(buf, uint64(len(part)))
		buf = append(buf, part...)
	}
	_, _ = h.Write(buf)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, nil
}

// Source derives keys from messages. Its zero value uses the consumer and dedupe key the
// middleware claimed the message under (wmonce.ClaimFromContext), else the router handler name
// and the message UUID.
type Source struct {
	// Consumer overrides the consumer name.
	Consumer string
	// MessageID overrides the message id: the function of the middleware's Config.Key.
	MessageID func(msg *message.Message) (string, error)
}

// Parts returns the consumer and message id Source would derive keys from.
func (s Source) Parts(msg *message.Message) (consumer, messageID string, err error) {
	if msg == nil {
		return "", "", fmt.Errorf("%w: message is nil", ErrInvalidPart)
	}
	claimedConsumer, _, _ := wmonce.ClaimFromContext(msg.Context())
	consumer = cmp.Or(s.Consumer, claimedConsumer, message.HandlerNameFromCtx(msg.Context()))
	if consumer == "" {
		return "", "", fmt.Errorf("%w: no consumer name: the message was not delivered by a Watermill router handler; set Source.Consumer", ErrInvalidPart)
	}
	if messageID, err = s.messageID(msg); err != nil {
		return "", "", err
	}
	if messageID == "" {
		return "", "", fmt.Errorf("%w: message %q has an empty id", ErrInvalidPart, msg.UUID)
	}
	return consumer, messageID, nil
}

// messageID returns the id keys of msg derive from: Source.MessageID's, else the key the
// middleware claimed msg under, else its UUID.
func (s Source) messageID(msg *message.Message) (string, error) {
	if s.MessageID != nil {
		id, err := s.MessageID(msg)
		if err != nil {
			return "", fmt.Errorf("%w: message id: %w", ErrInvalidPart, err)
		}
		return id, nil
	}
	if _, key, claimed := wmonce.ClaimFromContext(msg.Context()); claimed {
		return key, nil
	}
	return msg.UUID, nil
}

// Key returns Derive(consumer, message id, step) for msg.
func (s Source) Key(msg *message.Message, step string) (string, error) {
	consumer, id, err := s.Parts(msg)
	if err != nil {
		return "", err
	}
	return Derive(consumer, id, step)
}

// ForMessage is Source{}.Key: the key of step for a message in a middleware-wrapped handler.
func ForMessage(msg *message.Message, step string) (string, error) {
	return Source{}.Key(msg, step)
}
