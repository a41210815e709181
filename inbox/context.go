package inbox

import (
	"context"
	"time"
)

// Delivery describes the inbox row behind the message a processor handler is running.
//
// Calls outside the database are not covered by the processing transaction: give them a key
// that is the same on every attempt, derived from Consumer and MessageID (the row's dedupe
// key), e.g. idemkey.Derive(d.Consumer, d.MessageID, "charge").
type Delivery struct {
	ID          int64  // row id: the received order
	Consumer    string // consumer the row belongs to
	MessageID   string // dedupe key
	OrderingKey string // "" when the row is not ordered
	Topic       string // topic the message was received from
	Attempt     int    // 1 for the first attempt
	ReceivedAt  time.Time
}

type deliveryKey struct{}

func contextWithDelivery(ctx context.Context, d Delivery) context.Context {
	return context.WithValue(ctx, deliveryKey{}, d)
}

// DeliveryFromContext returns the inbox row behind the message being processed, from the
// message context a Processor hands its handler (msg.Context()).
func DeliveryFromContext(ctx context.Context) (Delivery, bool) {
	d, ok := ctx.Value(deliveryKey{}).(Delivery)
	return d, ok
}
