package inbox

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/outboxops"
)

// dueOf returns when msg's first attempt may start, from Watermill's delay metadata
// (outbox.MetadataDelayedUntil, as outboxops.DueAt reads it), as the RFC 3339 text the ingest
// statement takes; "" for a message without it. A value that is not a time is an error: the
// Receiver refuses the message rather than guess.
func dueOf(msg *message.Message) (string, error) {
	due, ok, err := outboxops.DueAt(msg.Metadata)
	if err != nil || !ok {
		return "", err
	}
	return due.UTC().Format(time.RFC3339Nano), nil
}
