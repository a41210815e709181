package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/oncetype"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

const (
	consumer     = "rewards"
	group        = "rewards"
	grantedTopic = "cashback-granted"
	poisonTopic  = "rewards.poison"
	accounts     = 20
)

type options struct {
	broker  broker.Config
	schema  string
	topic   string
	events  int
	timeout time.Duration
	out     io.Writer
	logger  watermill.LoggerAdapter
}

// summary is what a run observed, for the printout and the test.
type summary struct {
	Published       int // distinct valid events
	DuplicateCopies int // extra copies published
	Receiver        inbox.ReceiverCounters
	Processor       inbox.ProcessorCounters
	CashbackRows    int // cashback rows of this run
	GrantedInOutbox int // CashbackGranted messages of this run in the outbox
	Poisoned        int // refused messages parked by the poison-queue middleware
	ParkedRows      []inbox.Row
	Skipped         int
	OrderViolations int32
}

// payment is the PaymentCaptured event.
type payment struct {
	PaymentID   string `json:"payment_id"`
	Account     string `json:"account"`
	Seq         int    `json:"seq"` // per-account sequence, to check the processing order
	AmountPaise int64  `json:"amount_paise"`
}

func run(ctx context.Context, db *sql.DB, o options) (summary, error) {
	var s summary
	var orderViolations atomic.Int32
	if o.logger == nil {
		o.logger = watermill.NopLogger{}
	}
	m, err := migrate.New(db, migrate.Config{Schema: o.schema}, o.logger)
	if err != nil {
		return s, err
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		return s, err
	}
	cashback := pgtx.QualifiedName(o.schema, "example_cashback")
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+cashback+` (
    payment_id     text        PRIMARY KEY,
    account        text        NOT NULL,
    seq            int         NOT NULL,
    cashback_paise bigint      NOT NULL,
    granted_at     timestamptz NOT NULL DEFAULT now())`); err != nil {
		return s, fmt.Errorf("create cashback table: %w", err)
	}
	runID := newRunID()

	// The broker, with the group's subscription declared before anything is published.
	bc := o.broker
	bc.Subscriptions = append(bc.Subscriptions, broker.Subscription{Topic: o.topic, Group: group})
	b, err := broker.New(ctx, db, bc, o.logger)
	if err != nil {
		return s, err
	}
	defer b.Close()
	pub, sub, err := b.NewPubSub(ctx, group)
	if err != nil {
		return s, err
	}
	defer pub.Close()
	defer sub.Close()

	writer, err := outbox.NewWriter(outbox.Config{Schema: o.schema, ValidateTopic: broker.TopicValidator(b.Kind())})
	if err != nil {
		return s, err
	}
	ops, err := inbox.NewOps(db, inbox.OpsConfig{Schema: o.schema}, o.logger)
	if err != nil {
		return s, err
	}

	// Receiving: dedupe on the payment id, order per account, refuse what has neither.
	receiver, err := inbox.NewReceiver(db, inbox.ReceiverConfig{
		Schema:      o.schema,
		Consumer:    consumer,
		Key:         oncetype.KeyFromMetadata("payment_id"),
		OrderingKey: inbox.OrderingKeyFromMetadata("account"),
	}, o.logger)
	if err != nil {
		return s, err
	}
	defer receiver.Close()

	// Processing: grant 1% cashback once per payment, emitting CashbackGranted via the outbox.
	grant := func(msg *message.Message) ([]*message.Message, error) {
		var p payment
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return nil, oncetype.Permanent(fmt.Errorf("PaymentCaptured does not decode: %w", err))
		}
		tx, _ := pgtx.TxFromContext(msg.Context())
		var last sql.NullInt64
		if err := tx.QueryRowContext(msg.Context(), `SELECT max(seq) FROM `+cashback+` WHERE account = $1`, p.Account).Scan(&last); err != nil {
			return nil, err
		}
		if last.Valid && int(last.Int64) != p.Seq-1 {
			orderViolations.Add(1) // cannot happen: one handler per account at a time, in order
		}
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+cashback+` (payment_id, account, seq, cashback_paise) VALUES ($1, $2, $3, $4)`,
			p.PaymentID, p.Account, p.Seq, p.AmountPaise/100); err != nil {
			return nil, err
		}
		body, _ := json.Marshal(map[string]any{"payment_id": p.PaymentID, "account": p.Account, "cashback_paise": p.AmountPaise / 100})
		return []*message.Message{message.NewMessage("granted-"+p.PaymentID, body)}, nil
	}
	processor, err := inbox.NewProcessor(db, grant, inbox.ProcessorConfig{
		Schema:      o.schema,
		Consumer:    consumer,
		OutputTopic: grantedTopic,
		Outbox:      writer,
		MaxAttempts: 5,
		Backoff:     50 * time.Millisecond,
	}, o.logger)
	if err != nil {
		return s, err
	}
	processorDone := make(chan error, 1)
	go func() { processorDone <- processor.Run(context.WithoutCancel(ctx)) }()
	defer func() { _ = processor.Close(); <-processorDone }()

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, o.logger)
	if err != nil {
		return s, err
	}
	poison, err := wmiddleware.PoisonQueueWithFilter(writer.DBPublisher(db), poisonTopic, oncetype.IsPermanent)
	if err != nil {
		return s, err
	}
	router.AddConsumerHandler("rewards-inbox", o.topic, sub, receiver.Handle).AddMiddleware(poison)
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.WithoutCancel(ctx)) }()
	defer func() { _ = router.Close(); <-routerDone }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return s, fmt.Errorf("router stopped: %w", err)
	case <-ctx.Done():
		return s, ctx.Err()
	}

	// Publish: each event once, every tenth a second time under a new UUID (a retrying
	// producer), then one undecodable event and one without a payment id.
	start := time.Now()
	seqs := map[string]int{}
	var msgs []*message.Message
	for i := range o.events {
		acct := fmt.Sprintf("%s-acct-%d", runID, i%accounts)
		seqs[acct]++
		p := payment{PaymentID: fmt.Sprintf("%s-pay-%d", runID, i), Account: acct, Seq: seqs[acct], AmountPaise: int64(1000 + i)}
		msgs = append(msgs, paymentMessage(p))
		if i%10 == 0 {
			msgs = append(msgs, paymentMessage(p))
			s.DuplicateCopies++
		}
	}
	s.Published = o.events
	broken := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id": "truncated`))
	broken.Metadata.Set("payment_id", runID+"-pay-broken")
	broken.Metadata.Set("account", runID+"-acct-broken")
	broken.Metadata.Set("partition_key", runID+"-acct-broken")
	anonymous := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	anonymous.Metadata.Set("account", runID+"-acct-0")
	anonymous.Metadata.Set("partition_key", runID+"-acct-0")
	msgs = append(msgs, broken, anonymous)
	for _, m := range msgs { // one at a time: keeps each account's order on every broker
		if err := pub.Publish(o.topic, m); err != nil {
			return s, fmt.Errorf("publish: %w", err)
		}
	}
	published := time.Since(start)

	// Wait until every event is applied, the broken one parked and the anonymous one refused.
	deadline := time.Now().Add(o.timeout)
	for {
		pc, rc := processor.Counters(), receiver.Counters()
		if pc.Processed >= uint64(o.events) && pc.Parked >= 1 && rc.Refused >= 1 {
			break
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("timed out after %s: receiver %+v, processor %+v", o.timeout, rc, pc)
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	s.Receiver, s.Processor = receiver.Counters(), processor.Counters()
	s.OrderViolations = orderViolations.Load()

	// The operator's view: the parked row, then skip it with a reason.
	s.ParkedRows, err = ops.List(ctx, inbox.Filter{Consumer: consumer, MessageIDs: []string{runID + "-pay-broken"}}, 10)
	if err != nil {
		return s, err
	}
	s.Skipped, err = ops.SkipKey(ctx, consumer, runID+"-acct-broken", "producer sent a truncated payload; payment re-sent by hand")
	if err != nil {
		return s, err
	}
	stats, err := ops.Stats(ctx, consumer)
	if err != nil {
		return s, err
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+cashback+` WHERE payment_id LIKE $1`, runID+"-%").Scan(&s.CashbackRows); err != nil {
		return s, err
	}
	ob := writer.Table()
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+ob+` WHERE payload->>'destination_topic' = $1 AND uuid LIKE $2`, grantedTopic, "granted-"+runID+"-%").Scan(&s.GrantedInOutbox); err != nil {
		return s, err
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+ob+` WHERE payload->>'destination_topic' = $1 AND uuid = $2`, poisonTopic, anonymous.UUID).Scan(&s.Poisoned); err != nil {
		return s, err
	}

	w := o.out
	fmt.Fprintf(w, "broker %s, topic %q, consumer %q, run %s\n", b.Kind(), o.topic, consumer, runID)
	fmt.Fprintf(w, "published %d events + %d duplicate copies + 1 undecodable + 1 without payment id in %s\n",
		s.Published, s.DuplicateCopies, published.Round(time.Millisecond))
	fmt.Fprintf(w, "receiver:  %d rows stored, %d copies acked as duplicates, %d refused (parked on %s: %d), %d statements\n",
		s.Receiver.Stored, s.Receiver.Duplicates, s.Receiver.Refused, poisonTopic, s.Poisoned, s.Receiver.Batches)
	fmt.Fprintf(w, "processor: %d applied, %d failed attempts, %d parked, %d lease conflicts; done %s after the first publish\n",
		s.Processor.Processed, s.Processor.Failed, s.Processor.Parked, s.Processor.LeaseConflicts, elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "effects:   %d cashback rows, %d CashbackGranted messages in the outbox, %d per-account order violations\n",
		s.CashbackRows, s.GrantedInOutbox, s.OrderViolations)
	for _, r := range s.ParkedRows {
		fmt.Fprintf(w, "parked:    row %d, message %s, key %s, %d attempt(s), error: %s\n", r.ID, r.MessageID, r.OrderingKey, r.Attempts, r.LastError)
	}
	fmt.Fprintf(w, "skipped %d parked row(s); inbox now: %d pending, %d in progress, %d failed\n",
		s.Skipped, stats.Pending, stats.InProgress, stats.Failed)
	if s.CashbackRows != s.Published || s.OrderViolations != 0 || s.Poisoned != 1 || len(s.ParkedRows) != 1 {
		return s, errors.New("unexpected outcome: see the lines above")
	}
	return s, nil
}

func paymentMessage(p payment) *message.Message {
	body, _ := json.Marshal(p)
	m := message.NewMessage(watermill.NewUUID(), body)
	m.Metadata.Set("payment_id", p.PaymentID)
	m.Metadata.Set("account", p.Account)
	m.Metadata.Set("partition_key", p.Account) // Kafka: one account, one partition, in order
	return m
}

func newRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "r" + hex.EncodeToString(b)
}
