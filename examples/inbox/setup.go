package main

// Scaffolding: options, the tables, the broker and the database from the environment, and the
// goroutines run starts and stops. The pattern itself is in main.go.

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/examples/internal/scaffold"
	"github.com/wmonce/watermill-once/inbox"
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
	var stopKafka func()
	var err error
	o.broker, stopKafka, err = scaffold.BrokerFromEnv(ctx, o.logger, o.out)
	defer stopKafka()
	if err != nil {
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
func setUp(ctx context.Context, db *sql.DB, o options) (e *env, err error) {
	e = &env{runID: scaffold.RunID("r"), topic: o.topic, logger: o.logger, cashback: pgtx.QualifiedName(o.schema, "example_cashback"), db: db}
	if e.logger == nil {
		e.logger = watermill.NopLogger{}
	}
	if err = scaffold.Migrate(ctx, db, o.schema, e.logger); err != nil {
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
