// Command quickstart runs the README's Quick start (rewards.go, shown there verbatim) over
// Watermill's SQL pub/sub and shows what it does: one event delivered three times is applied
// once and its cashback event sent once, and an event the handler can never apply is parked
// instead of blocking the events behind it.
//
//	go run ./examples/quickstart
//
// It needs only PostgreSQL: DATABASE_URL, else the server on 127.0.0.1:5432, else an embedded
// one it starts for the run (not as root; see internal/embeddedpg).
// It ends with one JSON line of what it measured.
//
// rewards.go is the pattern; this file and setup.go are the scaffolding (database, pub/sub,
// publishing, counting).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/middleware/once"
)

const copies = 3

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) (err error) {
	logger := watermill.NewStdLogger(false, false)
	// PostgreSQL with the business table cashback_credits, and Watermill's SQL pub/sub on it.
	e, err := setUp(ctx, logger)
	if err != nil {
		return err
	}
	defer e.close()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	// What the service sends, as a downstream consumer would see it.
	cashback, err := e.watch(ctx, "cashback")
	if err != nil {
		return err
	}
	parked, err := e.watch(ctx, once.DefaultPoisonTopic)
	if err != nil {
		return err
	}

	done := make(chan error, 1)
	go func() { done <- runRewards(ctx, e.db, e.sub, e.pub, logger) }()
	defer func() {
		stop()
		if runErr := <-done; err == nil {
			err = runErr
		}
	}()

	id := watermill.NewShortUUID()
	eventID, brokenID, lastID := "e-"+id, "broken-"+id, "last-"+id
	// The same event, three times: a producer retry, a redelivery, a redrive.
	for range copies {
		if err := e.publish(eventID, fmt.Sprintf(`{"payment_id":"pay-%s","paise":120000}`, id)); err != nil {
			return err
		}
	}
	// An event the handler can never decode: parked, and the events behind it go on.
	if err := e.publish(brokenID, `{"payment_id":42}`); err != nil {
		return err
	}
	// One subscriber delivers in order: when the last event is applied, so is all before it.
	if err := e.publish(lastID, fmt.Sprintf(`{"payment_id":"last-%s","paise":100}`, id)); err != nil {
		return err
	}
	if err := waitUntil(60*time.Second, func() bool {
		return e.credits(ctx, "last-"+id) == 1 && cashback.count(eventID, lastID) == 2 && parked.count(brokenID) == 1
	}); err != nil {
		return fmt.Errorf("%w: the last event, its cashback and the parked event did not all arrive", err)
	}
	applied := e.credits(ctx, "pay-"+id)
	sent := cashback.count(eventID)
	fmt.Printf("event %s: %d copies delivered, applied %d time(s), cashback sent %d time(s); broken event parked on %s: %d\n",
		eventID, copies, applied, sent, once.DefaultPoisonTopic, parked.count(brokenID))
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"deliveries":    copies,
		"applied":       applied,
		"cashback_sent": sent,
		"parked":        parked.count(brokenID),
	})
}

// publish sends one payment event with the given UUID.
func (e *env) publish(uuid, payload string) error {
	return e.pub.Publish("payments", message.NewMessage(uuid, []byte(payload)))
}
