package main

// Scaffolding of the walk-through: the broker and PostgreSQL (from the environment for main),
// the schemas and topics of the run, the services' routers, the final figures, and closing it
// all in order. The walk-through itself is Run, in main.go.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/embeddedkafka"
	"github.com/wmonce/watermill-once/internal/embeddedpg"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/pgtx"
)

// runFromEnv runs the walk-through as the command does and returns its exit status: 2 for a
// bad environment, 1 for a failed run.
func runFromEnv() int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	logger := logFor(os.Getenv("DEMO_VERBOSE") != "")
	opts := Options{Prefix: "payments_demo", Out: os.Stdout, Logger: logger}

	// BROKER=kafka without KAFKA_BROKERS: an embedded Kafka-protocol broker, announced by Run.
	getenv := os.Getenv
	if strings.EqualFold(strings.TrimSpace(os.Getenv(broker.EnvBroker)), string(broker.Kafka)) && strings.TrimSpace(os.Getenv(broker.EnvKafkaBrokers)) == "" {
		ek, err := embeddedkafka.Start(ctx, logger)
		if err != nil {
			fmt.Fprintln(os.Stderr, "payments demo:", err)
			return 1
		}
		defer ek.Close()
		opts.EmbeddedKafka = ek
		getenv = func(k string) string {
			if k == broker.EnvKafkaBrokers {
				return strings.Join(ek.Addrs(), ",")
			}
			return os.Getenv(k)
		}
	}
	cfg, err := broker.ParseEnv(getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo:", err)
		return 2
	}
	if os.Getenv(broker.EnvSQLSchema) == "" {
		cfg.SQL.Schema = "payments_demo_broker" // reset with the demo's schemas on every run
	}
	// No DATABASE_URL and no server on 127.0.0.1:5432: an embedded PostgreSQL, announced here.
	// Ctrl-C ends the run through ctx, so that the embedded server is stopped and removed.
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	dbURL, stopDB, err := openDatabase(ctx, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo:", err)
		return 1
	}
	cfg.DatabaseURL = dbURL
	opts.Broker = cfg
	if opts.Debezium, err = debeziumFromEnv(); err != nil {
		fmt.Fprintln(os.Stderr, "payments demo:", err)
		return 2
	}
	_, err = Run(ctx, opts)
	if stopErr := stopDB(); stopErr != nil {
		fmt.Fprintln(os.Stderr, "payments demo: stopping the embedded PostgreSQL:", stopErr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo failed:", err)
		return 1
	}
	return 0
}

// openDatabase returns DATABASE_URL when set, else what embeddedpg finds or starts (announced
// on stdout), and the function that stops an embedded server and removes its data. (The
// broker config cannot tell: ParseEnv fills in the default URL.)
func openDatabase(ctx context.Context, logger watermill.LoggerAdapter) (string, func() error, error) {
	opts := embeddedpg.Options{Out: os.Stdout}
	if _, quiet := logger.(errorsOnly); !quiet { // DEMO_VERBOSE: the server's log too
		opts.Log = os.Stderr
	}
	return embeddedpg.DatabaseURL(ctx, opts)
}

// demo is what Run works with besides the services.
type demo struct {
	n        narrator
	logger   watermill.LoggerAdapter
	cfg      broker.Config
	db       *sql.DB
	broker   *broker.Broker
	pub      *transportStamper // the broker's publisher, stamping each copy with a transport id
	schemas  schemas
	reset    []string // the schemas dropped and recreated for this run
	topics   struct{ payments, cashback string }
	services context.Context // the services' goroutines run until close
	closers  []func()        // run by close, last first
}

type schemas struct{ payments, rewards, notifications string }

// setUp connects to the broker (starting an embedded Kafka if there is none) and PostgreSQL,
// resets and migrates the run's schemas, and names this run's topics.
func setUp(ctx context.Context, opts Options) (d *demo, err error) {
	d = &demo{n: newNarrator(opts.Out), logger: opts.Logger, cfg: opts.Broker}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.logger == nil {
		d.logger = watermill.NopLogger{}
	}
	if d.cfg.Kind == "" {
		d.cfg.Kind = broker.SQL
	}
	if err := d.startKafkaIfNone(ctx, opts.EmbeddedKafka); err != nil {
		return d, err
	}
	if err := d.openDatabase(ctx, opts.Prefix); err != nil {
		return d, err
	}
	if err := d.openBroker(ctx); err != nil {
		return d, err
	}
	return d, nil
}

// startKafkaIfNone starts an embedded Kafka for BROKER=kafka without brokers, and announces
// the embedded broker the run uses, whoever started it.
func (d *demo) startKafkaIfNone(ctx context.Context, ek *embeddedkafka.Broker) error {
	if d.cfg.Kind == broker.Kafka && len(d.cfg.Kafka.Brokers) == 0 && ek == nil {
		var err error
		if ek, err = embeddedkafka.Start(ctx, d.logger); err != nil {
			return err
		}
		d.push(ek.Close)
		d.cfg.Kafka.Brokers = ek.Addrs()
	}
	if ek != nil {
		d.n.step("KAFKA_BROKERS is not set: started an embedded Kafka-protocol broker (kfake) at %s (in memory, this run only)", strings.Join(ek.Addrs(), ","))
	}
	return nil
}

// openDatabase opens PostgreSQL and resets the run's schemas: the three services' and the SQL
// broker's when it starts with prefix.
func (d *demo) openDatabase(ctx context.Context, prefix string) error {
	dbURL := d.cfg.DatabaseURL
	if dbURL == "" {
		dbURL = pgtx.DefaultDatabaseURL
	}
	var err error
	if d.db, err = pgtx.Open(ctx, dbURL, pgtx.PoolConfig{MaxOpenConns: 16}); err != nil {
		return err
	}
	d.push(func() { _ = d.db.Close() })
	d.schemas = schemas{payments: prefix + "_payments", rewards: prefix + "_rewards", notifications: prefix + "_notifications"}
	d.reset = []string{d.schemas.payments, d.schemas.rewards, d.schemas.notifications}
	if d.cfg.Kind == broker.SQL && strings.HasPrefix(d.cfg.SQL.Schema, prefix) {
		d.reset = append(d.reset, d.cfg.SQL.Schema)
	}
	return d.schemas.setUp(ctx, d.db, d.reset, d.logger)
}

// openBroker names this run's topics, declares their subscriptions and opens the publisher.
func (d *demo) openBroker(ctx context.Context) error {
	run := shortID()
	d.topics.payments, d.topics.cashback = "payments-"+run, "cashback-"+run
	d.cfg.Subscriptions = []broker.Subscription{{Topic: d.topics.payments, Group: "rewards"}, {Topic: d.topics.cashback, Group: "notifications"}}
	if d.cfg.AMQP.Workers == 0 {
		// The walk-through narrates its deliveries one after the other: one in flight.
		d.cfg.AMQP.Workers, d.cfg.AMQP.Prefetch = 1, 1
	}
	var err error
	if d.broker, err = broker.New(ctx, d.db, d.cfg, d.logger); err != nil {
		return err
	}
	d.push(func() { _ = d.broker.Close() })
	d.n.step("broker %q: %s; topics %s and %s; schemas %s reset", d.cfg.Kind, describe(d.broker.Config()), d.topics.payments, d.topics.cashback, strings.Join(d.reset, ", "))
	brokerPub, err := d.broker.NewPublisher(ctx)
	if err != nil {
		return err
	}
	d.push(func() { _ = brokerPub.Close() })
	d.push(func() { cleanUpBroker(d.broker, d.cfg.Subscriptions, d.n) })
	d.pub = &transportStamper{next: brokerPub}
	return nil
}

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

// startServices creates rewards and notifications (services.go) with the fake SMS provider, and
// runs their routers until close.
func (d *demo) startServices(ctx context.Context) (*rewardsService, *notificationsService, error) {
	rewards, err := newRewards(d.db, d.broker, d.schemas.rewards, d.topics.payments, d.topics.cashback, d.n, d.logger)
	if err != nil {
		return nil, nil, err
	}
	provider := newFakeSMSProvider()
	d.push(provider.Close)
	notifications, err := newNotifications(d.db, d.broker, d.schemas.notifications, d.topics.cashback, provider, d.n, d.logger)
	if err != nil {
		return nil, nil, err
	}
	services, stop := context.WithCancel(ctx)
	d.services = services
	d.push(stop)
	for _, r := range []*message.Router{rewards.router, notifications.router} {
		go func() { _ = r.Run(services) }()
		d.push(func() { _ = r.Close() }) // before the broker clean-up, pushed earlier
		select {
		case <-r.Running():
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	return rewards, notifications, nil
}

// result measures the figures of the JSON line, narrates them, and checks them.
func (d *demo) result(ctx context.Context, rewards *rewardsService, notifications *notificationsService) (Result, error) {
	provider := notifications.provider
	res := Result{Broker: string(d.cfg.Kind), Deliveries: int(rewards.deliveries.Load()), SMSSent: provider.Sent()}
	if err := d.db.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(amount_paise), 0) FROM `+pgtx.QualifiedName(d.schemas.rewards, "cashback_credits")+` WHERE payment_id = $1`, paymentID).
		Scan(&res.Applied, &res.CashbackPaise); err != nil {
		return Result{}, err
	}
	counts := rewards.mw.Counters().Consumer("rewards")
	d.n.step("done: rewards saw %d deliveries of %s, applied %d (duplicates absorbed: %d), credited %s; the SMS provider sent %d SMS for %d requests",
		res.Deliveries, eventID, counts.Fresh, counts.Duplicates, rupees(res.CashbackPaise), res.SMSSent, provider.Requests())
	line, _ := json.Marshal(res)
	d.n.line(string(line))
	if res.Deliveries != 3 || res.Applied != 1 || res.CashbackPaise != 2400 || res.SMSSent != 1 {
		return res, fmt.Errorf("exactly-once violated: %s", line)
	}
	return res, nil
}

func (d *demo) push(f func()) { d.closers = append(d.closers, f) }

// close stops what setUp and startServices started, last first.
func (d *demo) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
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
