// Command inbox receives payment events from a broker into the inbox table, acks them at once,
// and grants cashback from the inbox with a processor: store first, process on our own terms.
//
// It publishes a batch of PaymentCaptured events (a tenth of them twice, as a retrying
// producer would, under new UUIDs but the same payment id), one event whose payload does not
// decode and one without a payment id, then waits until the processor has worked through the
// inbox and prints what happened:
//
//   - duplicates are acked by the receiver without a new row (the dedupe key is the payment id);
//   - the event without a payment id is refused by the receiver and parked by Watermill's
//     poison-queue middleware (into the outbox, topic rewards.poison);
//   - the undecodable event is stored, fails permanently in the processor and is parked as a
//     FAILED row, which the example then inspects and skips with the operations API;
//   - every other event is applied once, in per-account order, together with its
//     CashbackGranted message in the outbox.
//
// The broker comes from the environment through package broker (BROKER=sql|kafka|amqp,
// default sql, so only PostgreSQL is needed). With BROKER=kafka and no KAFKA_BROKERS an
// embedded Kafka (kfake) is started.
//
//	go run ./examples/inbox
//	BROKER=amqp go run ./examples/inbox -events 5000
//	BROKER=kafka go run ./examples/inbox
//
// This file is the pattern; setup.go, batch.go and report.go are the scaffolding around it.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/examples/internal/scaffold"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/pgtx"
)

const (
	consumer     = "rewards"          // the inbox's reader: scopes dedupe keys and rows
	group        = "rewards"          // the broker's consumer group
	grantedTopic = "cashback-granted" // where the handler's CashbackGranted messages go
	poisonTopic  = "rewards.poison"   // where refused messages are parked
)

func main() {
	o := options{timeout: 2 * time.Minute, out: os.Stdout}
	flag.IntVar(&o.events, "events", 1000, "payment events to publish")
	flag.StringVar(&o.schema, "schema", pgtx.DefaultSchema, "schema for watermill-once's tables and the example's cashback table")
	flag.StringVar(&o.topic, "topic", "payments", "topic the events are published to")
	verbose := flag.Bool("v", false, "log what Watermill and watermill-once do")
	flag.Parse()
	o.logger = scaffold.Logger(*verbose)
	if err := runFromEnv(o); err != nil { // the broker and PostgreSQL from the environment
		log.Fatal(err)
	}
}

// run receives, processes and reports one batch of events, as the package doc describes.
func run(ctx context.Context, db *sql.DB, o options) (summary, error) {
	e, err := setUp(ctx, db, o) // tables, the broker, the outbox writer, the inbox operations API
	if err != nil {
		return summary{}, err
	}
	defer e.close()

	// Receiving: store each event in the inbox and ack it at once. The dedupe key is the payment
	// id, so a producer's retry under a new UUID is acked without a new row; each account's rows
	// are processed in the order received; an event without a payment id is refused.
	receiver, err := inbox.NewReceiver(db, inbox.ReceiverConfig{
		Schema:      o.schema,
		Consumer:    consumer,
		Key:         wmonce.KeyFromMetadata("payment_id"),
		OrderingKey: wmonce.KeyFromMetadata("account"),
	}, e.logger)
	if err != nil {
		return summary{}, err
	}
	defer receiver.Close()

	// Processing: the handler, its output in the outbox and the row's move to DONE commit in one
	// transaction. A failing row is retried with backoff, then parked as FAILED.
	g := &grants{table: e.cashback}
	processor, err := inbox.NewProcessor(db, g.grant, inbox.ProcessorConfig{
		Schema:      o.schema,
		Consumer:    consumer,
		OutputTopic: grantedTopic,
		Outbox:      e.writer,
		MaxAttempts: 5,
		Backoff:     50 * time.Millisecond,
	}, e.logger)
	if err != nil {
		return summary{}, err
	}
	defer scaffold.InBackground(ctx, processor.Run, processor.Close)()

	// The router feeds the receiver; what the receiver refuses (a permanent error) is parked by
	// Watermill's poison-queue middleware, through the outbox: ParkingPublisher stores any
	// message, even one without a UUID or with binary headers (outbox.RecoverParked restores it).
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, e.logger)
	if err != nil {
		return summary{}, err
	}
	poison, err := wmiddleware.PoisonQueueWithFilter(e.writer.ParkingPublisher(db), poisonTopic, wmonce.IsPermanent)
	if err != nil {
		return summary{}, err
	}
	router.AddConsumerHandler("rewards-inbox", o.topic, e.sub, receiver.Handle).AddMiddleware(poison)
	stopRouter, err := scaffold.StartRouter(ctx, router)
	if err != nil {
		return summary{}, err
	}
	defer stopRouter()

	// Publish, then wait until every event is applied, the broken one parked, the anonymous one refused.
	b := newBatch(e.runID, o.events)
	if err := b.publish(e.pub, o.topic); err != nil {
		return summary{}, err
	}
	if err := scaffold.WaitUntil(ctx, o.timeout, func() bool {
		p, r := processor.Counters(), receiver.Counters()
		return p.Processed >= uint64(o.events) && p.Parked >= 1 && r.Refused >= 1
	}); err != nil {
		return summary{}, fmt.Errorf("%w: receiver %+v, processor %+v", err, receiver.Counters(), processor.Counters())
	}
	s := summary{Published: b.payments, DuplicateCopies: b.copies, Receiver: receiver.Counters(), Processor: processor.Counters(),
		OrderViolations: g.violations.Load(), elapsed: time.Since(b.start), publishing: b.took}

	// The operator's view: the parked row, then skip it with a reason.
	s.ParkedRows, err = e.ops.List(ctx, inbox.Filter{Consumer: consumer, MessageIDs: []string{b.brokenID}}, 10)
	if err != nil {
		return s, err
	}
	s.Skipped, err = e.ops.SkipKey(ctx, consumer, b.brokenAccount, "producer sent a truncated payload; payment re-sent by hand")
	if err != nil {
		return s, err
	}
	err = e.report(ctx, &s, b, o.out) // the effects in the database into s, printed and checked
	return s, err
}

// grants is the processor's handler: 1% cashback per payment, once, and a CashbackGranted
// message returned for the outbox.
type grants struct {
	table      string       // the cashback table (qualified)
	violations atomic.Int32 // payments seen out of their account's order: the ordering key keeps it 0
}

func (g *grants) grant(msg *message.Message) ([]*message.Message, error) {
	var p payment
	if err := json.Unmarshal(msg.Payload, &p); err != nil {
		return nil, wmonce.Permanent(fmt.Errorf("PaymentCaptured does not decode: %w", err)) // parked, not retried
	}
	ctx := msg.Context()
	tx, _ := pgtx.TxFromContext(ctx) // the processor's transaction
	var last sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT max(seq) FROM `+g.table+` WHERE account = $1`, p.Account).Scan(&last); err != nil {
		return nil, err
	}
	if last.Valid && int(last.Int64) != p.Seq-1 {
		g.violations.Add(1) // cannot happen: one row per account at a time, in order
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+g.table+` (payment_id, account, seq, cashback_paise) VALUES ($1, $2, $3, $4)`,
		p.PaymentID, p.Account, p.Seq, p.AmountPaise/100); err != nil {
		return nil, err
	}
	body, _ := json.Marshal(map[string]any{"payment_id": p.PaymentID, "account": p.Account, "cashback_paise": p.AmountPaise / 100})
	return []*message.Message{message.NewMessage("granted-"+p.PaymentID, body)}, nil
}
