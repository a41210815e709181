package main

// Scaffolding: options, the tables, the broker and the database from the environment, and the
// goroutines run starts and stops. The pattern itself is in main.go.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/embeddedkafka"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
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

// runFromEnv runs the example until it ends or Ctrl-C, with the broker from BROKER and friends
// (an embedded Kafka when BROKER=kafka and KAFKA_BROKERS is unset) and PostgreSQL at
// DATABASE_URL.
func runFromEnv(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	getenv := os.Getenv
	if strings.EqualFold(os.Getenv(broker.EnvBroker), string(broker.Kafka)) && os.Getenv(broker.EnvKafkaBrokers) == "" {
		ek, err := embeddedkafka.Start(ctx, o.logger)
		if err != nil {
			return err
		}
		defer ek.Close()
		addrs := strings.Join(ek.Addrs(), ",")
		getenv = func(k string) string {
			if k == broker.EnvKafkaBrokers {
				return addrs
			}
			return os.Getenv(k)
		}
		fmt.Fprintf(o.out, "started an embedded Kafka (kfake) at %s\n", addrs)
	}
	var err error
	if o.broker, err = broker.ParseEnv(getenv); err != nil {
		return err
	}
	databaseURL := os.Getenv(broker.EnvDatabaseURL)
	if databaseURL == "" {
		databaseURL = pgtx.DefaultDatabaseURL
	}
	db, err := pgtx.Open(ctx, databaseURL, pgtx.PoolConfig{MaxOpenConns: 16})
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = run(ctx, db, o)
	return err
}

func logFor(verbose bool) watermill.LoggerAdapter {
	if verbose {
		return watermill.NewStdLogger(false, false)
	}
	return watermill.NopLogger{}
}

// env is what run works with besides the pattern's own components.
type env struct {
	runID    string // prefixes this run's payment ids and accounts
	topic    string
	logger   watermill.LoggerAdapter
	cashback string // the example's business table (qualified)
	broker   *broker.Broker
	pub      message.Publisher
	sub      message.Subscriber
	writer   *outbox.Writer
	ops      *inbox.Ops
	db       *sql.DB
}

// setUp migrates o.schema, creates the cashback table and the broker (with the group's
// subscription declared before anything is published), its publisher and subscriber, the
// outbox writer and the inbox operations API.
func setUp(ctx context.Context, db *sql.DB, o options) (*env, error) {
	e := &env{runID: newRunID(), topic: o.topic, logger: o.logger, cashback: pgtx.QualifiedName(o.schema, "example_cashback"), db: db}
	if e.logger == nil {
		e.logger = watermill.NopLogger{}
	}
	m, err := migrate.New(db, migrate.Config{Schema: o.schema}, e.logger)
	if err != nil {
		return nil, err
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+e.cashback+` (
    payment_id     text        PRIMARY KEY,
    account        text        NOT NULL,
    seq            int         NOT NULL,
    cashback_paise bigint      NOT NULL,
    granted_at     timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create cashback table: %w", err)
	}

	bc := o.broker
	// One RabbitMQ delivery at a time: with AMQP.Workers (8) in flight, two payments of one
	// account can reach the receiver out of their queue order, and the inbox keeps the order it
	// received (the ordering key serialises processing, not arrival).
	bc.AMQP.Workers, bc.AMQP.Prefetch = 1, 1
	bc.Subscriptions = append(bc.Subscriptions, broker.Subscription{Topic: o.topic, Group: group})
	if e.broker, err = broker.New(ctx, db, bc, e.logger); err != nil {
		return nil, err
	}
	if e.pub, e.sub, err = e.broker.NewPubSub(ctx, group); err != nil {
		_ = e.broker.Close()
		return nil, err
	}
	if e.writer, err = outbox.NewWriter(outbox.Config{Schema: o.schema, ValidateTopic: broker.TopicValidator(e.broker.Kind())}); err != nil {
		e.close()
		return nil, err
	}
	if e.ops, err = inbox.NewOps(db, inbox.OpsConfig{Schema: o.schema}, e.logger); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *env) close() {
	_ = e.sub.Close()
	_ = e.pub.Close()
	_ = e.broker.Close()
}

// inBackground runs fn until the returned stop is called, which calls closeFn and waits for fn
// to return. fn's context is not cancelled with ctx: stop ends it, as a deferred call.
func inBackground(ctx context.Context, fn func(context.Context) error, closeFn func() error) (stop func()) {
	done := make(chan struct{})
	go func() { defer close(done); _ = fn(context.WithoutCancel(ctx)) }()
	return func() { _ = closeFn(); <-done }
}

// startRouter runs r in the background and returns once it is running, with the function that
// closes it and waits for Run to return.
func startRouter(ctx context.Context, r *message.Router) (stop func(), err error) {
	var runErr error
	done := make(chan struct{})
	go func() { defer close(done); runErr = r.Run(context.WithoutCancel(ctx)) }()
	stop = func() { _ = r.Close(); <-done }
	select {
	case <-r.Running():
		return stop, nil
	case <-done:
		return nil, fmt.Errorf("router stopped: %w", runErr)
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}
}

// waitUntil checks cond every 20ms (it reads in-memory counters: no query) until it holds, ctx
// ends or timeout passes.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("timed out after %s", timeout)
		case <-tick.C:
		}
	}
	return nil
}

func newRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "r" + hex.EncodeToString(b)
}
