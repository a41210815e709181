package intent_test

import (
	"context"
	"database/sql"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/effects/intent"
)

type gateway struct{}

func (gateway) Send(ctx context.Context, in intent.Intent) (string, error) {
	// POST in.Payload to the SMS gateway with in.Key as its idempotency key or client
	// reference (idemkey.Transport does it from ctx) and return the gateway's message id.
	return "msg_1", nil
}

// A handler records the SMS in its transaction; a Sender sends it afterwards.
func ExampleStore_Record() {
	var db *sql.DB // pgtx.Open(...) and migrations applied
	store, err := intent.NewStore(db, intent.StoreConfig{})
	if err != nil {
		return
	}
	// Inside an effectively-once handler: one intent per (event, channel), committed with the
	// handler's other writes.
	handler := func(msg *message.Message) ([]*message.Message, error) {
		_, err := store.Record(msg, intent.Draft{Channel: "sms", Payload: []byte(`{"to":"+919800000000","text":"Rs 2,400 cashback credited"}`)})
		return nil, err
	}
	_ = handler

	sender, err := intent.NewSender(db, intent.SenderConfig{
		Channels: map[string]intent.Channel{
			// The gateway cannot look sends up, so the crash policy must be chosen: a duplicate
			// cashback SMS is tolerable, a missing one is not.
			"sms": {Provider: gateway{}, OnCrash: intent.Resend},
		},
	}, watermill.NopLogger{})
	if err != nil {
		return
	}
	go func() { _ = sender.Run(context.Background()) }()
	defer sender.Close()
}
