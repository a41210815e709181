package main

// Scaffolding: options, the tables, the broker and the database from the environment, the
// relay that publishes every message twice, and the goroutines run starts and stops. The
// pattern itself is in main.go.

import (
	"cmp"
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
	"github.com/wmonce/watermill-once/internal/embeddedpg"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// The names (after the run's prefix) of the topic every event goes to, and of the topic the
// Stack parks messages on.
const (
	eventsTopic = "events"
	poisonTopic = "poison"
)

type options struct {
	broker   broker.Config
	schema   string
	bookings int
	timeout  time.Duration
	out      io.Writer
	logger   watermill.LoggerAdapter
	runID    string // names the run's topics and hotel; default a new one
}

// runFromEnv runs the example until it ends or Ctrl-C, with the broker from BROKER and friends
// (an embedded Kafka when BROKER=kafka and KAFKA_BROKERS is unset) and PostgreSQL at
// DATABASE_URL, else on 127.0.0.1:5432, else an embedded one.
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
	databaseURL, stopDB, err := embeddedpg.DatabaseURL(ctx, embeddedpg.Options{Out: o.out})
	if err != nil {
		return err
	}
	defer func() { _ = stopDB() }()
	db, err := pgtx.Open(ctx, databaseURL, pgtx.PoolConfig{})
	if err != nil {
		return err
	}
	defer db.Close()
	s, err := run(ctx, db, o)
	if err != nil {
		return err
	}
	return s.printJSON(o.out)
}

// tables are the hotel's business tables (qualified). bookings and beer_orders have no unique
// constraint on purpose: the middleware, not the table, keeps copies out, and the test would
// see a copy applied twice.
type tables struct {
	requests, bookings, beerOrders, reports string
}

// env is what run works with besides the pattern's own components.
type env struct {
	runID  string // prefixes this run's topics and booking ids; the hotel's name
	logger watermill.LoggerAdapter
	tables tables
	db     *sql.DB
	broker *broker.Broker
	pub    message.Publisher
	writer *outbox.Writer
	stop   []func()
}

// topic is this run's topic for name (a command's name, or eventsTopic).
func (e *env) topic(name string) string { return e.runID + "." + name }

// setUp migrates o.schema, creates the hotel's tables and the broker (every handler's
// subscription declared before anything is published), the outbox Writer, and starts the relay.
func setUp(ctx context.Context, db *sql.DB, o options) (e *env, err error) {
	e = &env{runID: cmp.Or(o.runID, scaffold.RunID("hotel-")), logger: o.logger, db: db}
	if e.logger == nil {
		e.logger = watermill.NopLogger{}
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if err = scaffold.Migrate(ctx, db, o.schema, e.logger); err != nil {
		return e, err
	}
	q := func(name string) string { return pgtx.QualifiedName(o.schema, name) }
	e.tables = tables{requests: q("hotel_booking_requests"), bookings: q("hotel_bookings"), beerOrders: q("hotel_beer_orders"), reports: q("hotel_reports")}
	if _, err := db.ExecContext(ctx, `
CREATE TABLE IF NOT EXISTS `+e.tables.requests+` (booking_id text NOT NULL, hotel text NOT NULL, guest text NOT NULL);
CREATE TABLE IF NOT EXISTS `+e.tables.bookings+` (booking_id text NOT NULL, hotel text NOT NULL, room_id text NOT NULL, guest text NOT NULL, price bigint NOT NULL);
CREATE TABLE IF NOT EXISTS `+e.tables.beerOrders+` (booking_id text NOT NULL, hotel text NOT NULL, room_id text NOT NULL, beers bigint NOT NULL);
CREATE TABLE IF NOT EXISTS `+e.tables.reports+` (hotel text PRIMARY KEY, bookings bigint NOT NULL, revenue bigint NOT NULL, beers bigint NOT NULL)`); err != nil {
		return e, fmt.Errorf("create the hotel's tables: %w", err)
	}

	bc := o.broker
	bc.Subscriptions = append(bc.Subscriptions,
		broker.Subscription{Topic: e.topic("BookRoom"), Group: bookRoomHandler},
		broker.Subscription{Topic: e.topic("OrderBeer"), Group: orderBeerHandler},
		broker.Subscription{Topic: e.topic(eventsTopic), Group: orderBeerOnRoomBooked},
		broker.Subscription{Topic: e.topic(eventsTopic), Group: financialReport},
	)
	if e.broker, err = broker.New(ctx, db, bc, e.logger); err != nil {
		return e, err
	}
	if e.pub, err = e.broker.NewPublisher(ctx); err != nil {
		return e, err
	}
	if e.writer, err = outbox.NewWriter(outbox.Config{Schema: o.schema, ValidateTopic: broker.TopicValidator(e.broker.Kind())}); err != nil {
		return e, err
	}
	relay, err := outbox.NewRelay(db, twice{e.pub}, outbox.RelayConfig{Schema: o.schema}, e.logger)
	if err != nil {
		return e, err
	}
	e.stop = append(e.stop, scaffold.InBackground(ctx, relay.Run, relay.Close))
	return e, nil
}

func (e *env) close() {
	for i := len(e.stop) - 1; i >= 0; i-- {
		e.stop[i]()
	}
	if e.pub != nil {
		_ = e.pub.Close()
	}
	if e.broker != nil {
		_ = e.broker.Close()
	}
}

// parked counts the parked copies of the message id (0 when the query fails: it is retried).
func (e *env) parked(ctx context.Context, id string) int {
	var n int
	_ = e.db.QueryRowContext(ctx, `SELECT count(*) FROM `+e.writer.Table()+` WHERE payload->>'destination_topic' = $1 AND uuid = $2`,
		e.topic(poisonTopic), id).Scan(&n)
	return n
}

// bookings returns n BookRoom commands of this run, the hotel being the run.
func (e *env) bookings(n int) []BookRoom {
	b := make([]BookRoom, n)
	for i := range b {
		b[i] = BookRoom{
			BookingID: fmt.Sprintf("%s-%d", e.runID, i),
			Hotel:     e.runID,
			RoomID:    fmt.Sprintf("room-%d", i%7+1),
			Guest:     fmt.Sprintf("guest %d", i),
			Price:     100 + int64(i)*7,
		}
	}
	return b
}

// twice publishes every call twice, as a relay that crashed after publishing a batch and
// before saving its position would: every message reaches its consumers as two copies with
// one UUID.
type twice struct{ message.Publisher }

func (p twice) Publish(topic string, msgs ...*message.Message) error {
	for range 2 {
		copies := make([]*message.Message, len(msgs))
		for i, m := range msgs {
			copies[i] = m.Copy()
			copies[i].SetContext(m.Context())
		}
		if err := p.Publisher.Publish(topic, copies...); err != nil {
			return err
		}
	}
	return nil
}
