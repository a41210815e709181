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
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Options configure one run of the walk-through.
type Options struct {
	Broker broker.Config
	// Prefix names the schemas the run resets and uses: <Prefix>_payments, _rewards,
	// _notifications (and the SQL broker's, when it starts with Prefix).
	Prefix string
	Out    io.Writer
	Logger watermill.LoggerAdapter
	// EmbeddedKafka is the embedded broker Broker.Kafka points at, if the caller started one
	// (announced in the narration). With BROKER=kafka and no brokers at all, Run starts one.
	EmbeddedKafka *broker.EmbeddedKafka
}

// Result is the final JSON line: every figure is measured, none is a constant.
type Result struct {
	Broker        string `json:"broker"`
	Deliveries    int    `json:"deliveries"`     // copies of e-91 the rewards consumer received
	Applied       int    `json:"applied"`        // cashback_credits rows for pay_42
	CashbackPaise int64  `json:"cashback_paise"` // their sum
	SMSSent       int    `json:"sms_sent"`       // SMS the provider actually sent
}

const (
	paymentID   = "pay_42"
	eventID     = "e-91"
	amountPaise = 120000 // 1,200.00
	phone       = "+91-98765-43210"
)

// Run performs the walk-through and prints the narration and the JSON line to opts.Out. It
// returns an error if a step fails or a figure is not what exactly-once requires.
func Run(ctx context.Context, opts Options) (Result, error) {
	n := newNarrator(opts.Out)
	logger := opts.Logger
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	cfg := opts.Broker
	if cfg.Kind == "" {
		cfg.Kind = broker.SQL
	}

	if cfg.Kind == broker.Kafka && len(cfg.Kafka.Brokers) == 0 && opts.EmbeddedKafka == nil {
		ek, err := broker.StartEmbeddedKafka(ctx, logger)
		if err != nil {
			return Result{}, err
		}
		defer ek.Close()
		cfg.Kafka.Brokers = ek.Addrs()
		opts.EmbeddedKafka = ek
	}
	if ek := opts.EmbeddedKafka; ek != nil {
		n.step("KAFKA_BROKERS is not set: started an embedded Kafka-protocol broker (kfake) at %s (in memory, this run only)", strings.Join(ek.Addrs(), ","))
	}

	dbURL := cfg.DatabaseURL
	if dbURL == "" {
		dbURL = pgtx.DefaultDatabaseURL
	}
	db, err := pgtx.Open(ctx, dbURL, pgtx.PoolConfig{MaxOpenConns: 16})
	if err != nil {
		return Result{}, err
	}
	defer db.Close()

	s := schemas{payments: opts.Prefix + "_payments", rewards: opts.Prefix + "_rewards", notifications: opts.Prefix + "_notifications"}
	reset := []string{s.payments, s.rewards, s.notifications}
	if cfg.Kind == broker.SQL && strings.HasPrefix(cfg.SQL.Schema, opts.Prefix) {
		reset = append(reset, cfg.SQL.Schema)
	}
	if err := s.setUp(ctx, db, reset, logger); err != nil {
		return Result{}, err
	}
	run := shortID()
	topics := struct{ payments, cashback string }{"payments-" + run, "cashback-" + run}
	cfg.Subscriptions = []broker.Subscription{{Topic: topics.payments, Group: "rewards"}, {Topic: topics.cashback, Group: "notifications"}}

	if cfg.AMQP.Workers == 0 {
		// The walk-through narrates its deliveries one after the other: one in flight.
		cfg.AMQP.Workers, cfg.AMQP.Prefetch = 1, 1
	}
	b, err := broker.New(ctx, db, cfg, logger)
	if err != nil {
		return Result{}, err
	}
	defer b.Close()
	n.step("broker %q: %s; topics %s and %s; schemas %s reset", cfg.Kind, describe(b.Config()), topics.payments, topics.cashback, strings.Join(reset, ", "))
	brokerPub, err := b.NewPublisher(ctx)
	if err != nil {
		return Result{}, err
	}
	defer brokerPub.Close()
	defer cleanUpBroker(b, cfg.Subscriptions, n)
	pub := &transportStamper{next: brokerPub}

	// The two consuming services, each with its own schema (dedupe table, outbox, business rows).
	rewards, err := newRewards(db, b, s.rewards, topics.payments, topics.cashback, n, logger)
	if err != nil {
		return Result{}, err
	}
	provider := newFakeSMSProvider()
	defer provider.Close()
	notifications, err := newNotifications(db, b, s.notifications, topics.cashback, provider, n, logger)
	if err != nil {
		return Result{}, err
	}
	services, stop := context.WithCancel(ctx)
	defer stop()
	for _, r := range []*message.Router{rewards.router, notifications.router} {
		go func() { _ = r.Run(services) }()
		defer r.Close() // before the broker clean-up, which was deferred earlier
		select {
		case <-r.Running():
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}

	// 1. payments: the payment row and its event commit together.
	event, err := pay(ctx, db, s.payments, topics.payments)
	if err != nil {
		return Result{}, err
	}
	n.step("payments: committed %s SUCCESS (%s) and PaymentSucceeded %s in ONE transaction (payments row + outbox row)", paymentID, rupees(amountPaise), eventID)

	// 2. the relay publishes, crashes before recording its position, and publishes again.
	relayCfg := outbox.RelayConfig{Schema: s.payments, Name: "payments-relay", Backoff: 50 * time.Millisecond}
	crashCtx, crash := context.WithCancel(ctx)
	crashing := &publishThenCrash{next: pub, crash: crash}
	relay1, err := outbox.NewRelay(db, crashing, relayCfg, watermill.NopLogger{}) // its crash is narrated
	if err != nil {
		return Result{}, err
	}
	if err := untilDone(ctx, "relay #1 publishing e-91", func() (bool, error) {
		_, err := relay1.RelayOnce(crashCtx)
		return crashing.crashed.Load(), ignoreCrash(err, crashCtx)
	}); err != nil {
		return Result{}, err
	}
	n.step("relay #1: published %s to the broker (transport %s) and CRASHED before recording its position", eventID, pub.last())
	relay2, err := outbox.NewRelay(db, pub, relayCfg, logger)
	if err != nil {
		return Result{}, err
	}
	if err := untilDone(ctx, "relay #2 republishing e-91", func() (bool, error) {
		k, err := relay2.RelayOnce(ctx)
		return k == 1, err
	}); err != nil {
		return Result{}, err
	}
	n.step("relay #2: restarted from the recorded position and published %s AGAIN (transport %s); position recorded", eventID, pub.last())
	if err := waitFor(ctx, "rewards to receive both copies", func() bool { return rewards.deliveries.Load() >= 2 }); err != nil {
		return Result{}, err
	}

	// The rewards service forwards its own outbox (CashbackCredited) from now on.
	rewardsRelay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: s.rewards, Name: "rewards-relay", PollInterval: 50 * time.Millisecond}, logger)
	if err != nil {
		return Result{}, err
	}
	go func() { _ = rewardsRelay.Run(services) }()
	defer rewardsRelay.Close()

	// 4. an operator redrives e-91: a third copy, new transport id, same event id.
	redrive := message.NewMessage(eventID, event.Payload)
	for k, v := range event.Metadata {
		redrive.Metadata.Set(k, v)
	}
	if err := pub.Publish(topics.payments, redrive); err != nil {
		return Result{}, fmt.Errorf("redrive: %w", err)
	}
	n.step("ops: redrove %s from the dead-letter archive: a third copy under a NEW transport id (%s), SAME event id", eventID, pub.last())
	if err := waitFor(ctx, "rewards to receive the redriven copy", func() bool { return rewards.deliveries.Load() >= 3 }); err != nil {
		return Result{}, err
	}

	// 5. notifications: SMS intent recorded once, sent through the provider with an idempotency key.
	go notifications.sendLoop(services)
	if err := waitFor(ctx, "the SMS to be sent and marked SENT", func() bool { return notifications.sent(ctx) >= 1 }); err != nil {
		return Result{}, err
	}

	res := Result{Broker: string(cfg.Kind), Deliveries: int(rewards.deliveries.Load()), SMSSent: provider.Sent()}
	if err := db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(amount_paise), 0) FROM `+pgtx.QualifiedName(s.rewards, "cashback_credits")+` WHERE payment_id = $1`, paymentID).
		Scan(&res.Applied, &res.CashbackPaise); err != nil {
		return Result{}, err
	}
	counts := rewards.mw.Counters("rewards")
	n.step("done: rewards saw %d deliveries of %s, applied %d (duplicates absorbed: %d), credited %s; the SMS provider sent %d SMS for %d requests",
		res.Deliveries, eventID, counts.Fresh, counts.Duplicates, rupees(res.CashbackPaise), res.SMSSent, provider.Requests())
	line, _ := json.Marshal(res)
	n.line(string(line))
	if res.Deliveries != 3 || res.Applied != 1 || res.CashbackPaise != 2400 || res.SMSSent != 1 {
		return res, fmt.Errorf("exactly-once violated: %s", line)
	}
	return res, nil
}

type schemas struct{ payments, rewards, notifications string }

// setUp drops the demo's schemas, applies watermill-once's migrations to each service schema and
// creates the business tables.
func (s schemas) setUp(ctx context.Context, db *sql.DB, reset []string, logger watermill.LoggerAdapter) error {
	for _, name := range reset {
		if err := pgtx.ValidateIdentifier("demo schema", name); err != nil {
			return err
		}
		if _, err := db.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(name)+` CASCADE`); err != nil {
			return fmt.Errorf("reset schema %s: %w", name, err)
		}
	}
	for _, name := range []string{s.payments, s.rewards, s.notifications} {
		m, err := migrate.New(db, migrate.Config{Schema: name}, logger)
		if err != nil {
			return err
		}
		if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
	}
	_, err := db.ExecContext(ctx, `
CREATE TABLE `+pgtx.QualifiedName(s.payments, "payments")+` (
	id           text PRIMARY KEY,
	status       text   NOT NULL,
	amount_paise bigint NOT NULL,
	phone        text   NOT NULL
);
CREATE TABLE `+pgtx.QualifiedName(s.rewards, "cashback_credits")+` (
	payment_id   text PRIMARY KEY, -- UNIQUE (payment_id): one credit per payment, whatever the event id
	event_id     text        NOT NULL,
	amount_paise bigint      NOT NULL,
	credited_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE `+pgtx.QualifiedName(s.notifications, "sms_intents")+` (
	idempotency_key     text PRIMARY KEY, -- sha256(consumer, event id, step)
	event_id            text        NOT NULL,
	phone               text        NOT NULL,
	body                text        NOT NULL,
	status              text        NOT NULL DEFAULT 'PENDING',
	provider_message_id text,
	created_at          timestamptz NOT NULL DEFAULT now(),
	sent_at             timestamptz
)`)
	return err
}

// pay is the payments service: one transaction writes the payment and stores its event.
func pay(ctx context.Context, db *sql.DB, schema, topic string) (*message.Message, error) {
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	payload, _ := json.Marshal(paymentSucceeded{Type: "PaymentSucceeded", PaymentID: paymentID, AmountPaise: amountPaise, Phone: phone})
	msg := message.NewMessage(eventID, payload)
	msg.Metadata.Set("partition_key", paymentID)
	msg.Metadata.Set("event_type", "PaymentSucceeded")
	err = pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+pgtx.QualifiedName(schema, "payments")+` (id, status, amount_paise, phone) VALUES ($1, 'SUCCESS', $2, $3)`, paymentID, amountPaise, phone); err != nil {
			return err
		}
		return w.PublishTx(ctx, tx, topic, msg)
	})
	if err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	return msg, nil
}

type paymentSucceeded struct {
	Type        string `json:"type"`
	PaymentID   string `json:"payment_id"`
	AmountPaise int64  `json:"amount_paise"`
	Phone       string `json:"phone"`
}

type cashbackCredited struct {
	Type        string `json:"type"`
	PaymentID   string `json:"payment_id"`
	AmountPaise int64  `json:"amount_paise"`
	Phone       string `json:"phone"`
}

// transportStamper gives every physical publish a new transport_id, the way a broker gives every
// copy a new offset or delivery tag: it changes with each copy, the event id (UUID) does not.
type transportStamper struct {
	next   message.Publisher
	lastID atomic.Value
}

func (p *transportStamper) Publish(topic string, msgs ...*message.Message) error {
	copies := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		c := m.Copy()
		id := "t-" + shortID()
		c.Metadata.Set("transport_id", id)
		p.lastID.Store(id)
		copies[i] = c
	}
	return p.next.Publish(topic, copies...)
}

func (p *transportStamper) Close() error { return nil }

func (p *transportStamper) last() string {
	s, _ := p.lastID.Load().(string)
	return s
}

// publishThenCrash publishes, then behaves like a process that died before the relay recorded
// its position: it cancels the relay's context and fails.
type publishThenCrash struct {
	next    message.Publisher
	crash   context.CancelFunc
	crashed atomic.Bool
}

var errRelayCrashed = errors.New("relay process crashed after publishing")

func (p *publishThenCrash) Publish(topic string, msgs ...*message.Message) error {
	if err := p.next.Publish(topic, msgs...); err != nil {
		return err
	}
	p.crashed.Store(true)
	p.crash()
	return errRelayCrashed
}

func (p *publishThenCrash) Close() error { return nil }

func ignoreCrash(err error, crashCtx context.Context) error {
	if err == nil || crashCtx.Err() != nil {
		return nil
	}
	return err
}

// untilDone calls fn until it reports done (the relay only sees rows once older transactions
// on the server have finished, so a round can find nothing at first).
func untilDone(ctx context.Context, what string, fn func() (bool, error)) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		done, err := fn()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitFor(ctx context.Context, what string, cond func() bool) error {
	return untilDone(ctx, what, func() (bool, error) { return cond(), nil })
}

func describe(c broker.Config) string {
	switch c.Kind {
	case broker.Kafka:
		return "Kafka at " + strings.Join(c.Kafka.Brokers, ",") + " (idempotent producer, acks=all, partition key = payment id)"
	case broker.AMQP:
		return "RabbitMQ at " + redact(c.AMQP.URL) + " (publisher confirms, durable " + c.AMQP.QueueType + " queues)"
	default:
		return "Watermill SQL Pub/Sub on PostgreSQL, topic tables in schema " + c.SQL.Schema
	}
}

func redact(raw string) string {
	if i := strings.Index(raw, "@"); i >= 0 {
		if j := strings.Index(raw, "://"); j >= 0 && j < i {
			return raw[:j+3] + "***" + raw[i:]
		}
	}
	return raw
}

func cleanUpBroker(b *broker.Broker, subs []broker.Subscription, n narrator) {
	var err error
	switch b.Kind() {
	case broker.Kafka:
		topics := make([]string, 0, len(subs))
		for _, s := range subs {
			topics = append(topics, s.Topic)
		}
		err = b.DeleteKafkaTopics(topics...)
	case broker.AMQP:
		err = b.DeleteAMQPTopology(subs...)
	default:
		return // SQL topic tables stay in their schema until the next run resets it
	}
	if err != nil {
		n.say("(cleanup of this run's %s topics failed: %v)", b.Kind(), err)
	}
}

// rupees formats integer paise as ₹1,200.00.
func rupees(paise int64) string {
	whole := fmt.Sprint(paise / 100)
	for i := len(whole) - 3; i > 0; i -= 3 {
		whole = whole[:i] + "," + whole[i:]
	}
	return fmt.Sprintf("₹%s.%02d", whole, paise%100)
}

func shortID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
