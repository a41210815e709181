package inbox_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Store first, ack at once, process later: three deliveries (one a copy) become two rows, each
// applied once by the processor in its own transaction.
func Example() {
	ctx := context.Background()
	db, err := pgtx.Open(ctx, pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 8})
	if err != nil {
		panic(err)
	}
	defer db.Close()
	schema := pgtest.NewName("example") // a throw-away schema; normally pgtx.DefaultSchema
	m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
	if err != nil {
		panic(err)
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		panic(err)
	}
	defer func() { _, _ = db.Exec(`DROP SCHEMA ` + pgtx.QuoteIdentifier(schema) + ` CASCADE`) }()
	ledger := pgtx.QualifiedName(schema, "ledger")
	_, _ = db.Exec(`CREATE TABLE ` + ledger + ` (payment_id text PRIMARY KEY)`)

	receiver, err := inbox.NewReceiver(db, inbox.ReceiverConfig{Schema: schema, Consumer: "ledger"}, nil)
	if err != nil {
		panic(err)
	}
	defer receiver.Close()
	for _, id := range []string{"pay-1", "pay-2", "pay-1"} {
		// In a router: router.AddConsumerHandler(name, topic, subscriber, receiver.Handle).
		if err := receiver.Handle(message.NewMessage(id, []byte(`{}`))); err != nil {
			panic(err)
		}
	}
	fmt.Printf("stored %d, duplicates %d\n", receiver.Counters().Stored, receiver.Counters().Duplicates)

	record := func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgtx.TxFromContext(msg.Context()) // commits together with the row's move to DONE
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+ledger+` VALUES ($1)`, msg.UUID)
		return nil, err
	}
	processor, err := inbox.NewProcessor(db, record, inbox.ProcessorConfig{Schema: schema, Consumer: "ledger"}, nil)
	if err != nil {
		panic(err)
	}
	go func() { _ = processor.Run(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); processor.Counters().Processed < 2 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	_ = processor.Close()
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM ` + ledger).Scan(&n)
	fmt.Printf("processed %d, ledger rows %d\n", processor.Counters().Processed, n)
	// Output:
	// stored 2, duplicates 1
	// processed 2, ledger rows 2
}

// A message the receiver refuses (here: it lacks the key header, and its producer set no
// UUID) is parked through the outbox by Watermill's poison queue and acked, and the original
// comes back from the poison topic.
func ExampleReceiver_parking() {
	ctx := context.Background()
	db, err := pgtx.Open(ctx, pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 4})
	if err != nil {
		panic(err)
	}
	defer db.Close()
	schema := pgtest.NewName("example") // a throw-away schema; normally pgtx.DefaultSchema
	m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
	if err != nil {
		panic(err)
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		panic(err)
	}
	defer func() { _, _ = db.Exec(`DROP SCHEMA ` + pgtx.QuoteIdentifier(schema) + ` CASCADE`) }()

	receiver, err := inbox.NewReceiver(db, inbox.ReceiverConfig{
		Schema: schema, Consumer: "ledger", Key: wmonce.KeyFromMetadata("event_id"),
	}, nil)
	if err != nil {
		panic(err)
	}
	defer receiver.Close()
	writer, err := outbox.NewWriter(outbox.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	poison, err := middleware.PoisonQueueWithFilter(writer.ParkingPublisher(db), "ledger.parked", wmonce.IsPermanent)
	if err != nil {
		panic(err)
	}
	// In a router: router.AddConsumerHandler(name, topic, subscriber, receiver.Handle).AddMiddleware(poison).
	handle := poison(func(msg *message.Message) ([]*message.Message, error) { return nil, receiver.Handle(msg) })

	foreign := message.NewMessage("", []byte(`{"amount":5}`)) // no UUID, no event_id header
	foreign.Metadata.Set("source", "legacy")
	_, err = handle(foreign)
	fmt.Printf("acked: %t, refused %d, stored %d\n", err == nil, receiver.Counters().Refused, receiver.Counters().Stored)

	// The relay forwards the parked copy to the poison topic (a Go channel here, a broker in
	// production), where RecoverParked gives back the original.
	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	parked, err := broker.Subscribe(ctx, "ledger.parked")
	if err != nil {
		panic(err)
	}
	relay, err := outbox.NewRelay(db, broker, outbox.RelayConfig{Schema: schema}, nil)
	if err != nil {
		panic(err)
	}
	if _, err := relay.RelayOnce(ctx); err != nil {
		panic(err)
	}
	p := <-parked
	p.Ack()
	original, err := outbox.RecoverParked(p)
	if err != nil {
		panic(err)
	}
	fmt.Printf("parked copy: uuid_missing=%s\n", p.Metadata.Get("uuid_missing"))
	fmt.Printf("original: uuid %q, source %q, payload %s\n", original.UUID, original.Metadata.Get("source"), original.Payload)
	fmt.Println("reason:", original.Metadata.Get(middleware.ReasonForPoisonedKey) != "")
	// Output:
	// acked: true, refused 1, stored 0
	// parked copy: uuid_missing=true
	// original: uuid "", source "legacy", payload {"amount":5}
	// reason: true
}
