// Command cqrs runs Watermill's CQRS component (components/cqrs) effectively-once: the hotel of
// Watermill's basic/5-cqrs-protobuf example, with every command and event handler applying each
// message once and publishing through the outbox in its own transaction.
//
//   - The front desk (code outside any handler) takes bookings: the request's row and its
//     BookRoom command commit in one transaction (pgtx.RunInTx and the command bus).
//   - BookRoomHandler (CommandProcessor) books the room and publishes RoomBooked.
//   - OrderBeerOnRoomBooked (EventProcessor) sends an OrderBeer command for each booking.
//   - OrderBeerHandler (CommandProcessor) records the order and publishes BeerOrdered.
//   - The FinancialReport group (EventGroupProcessor) adds RoomBooked and BeerOrdered to the
//     hotel's report: increments, which a copy applied twice would count twice.
//   - One BookRoom command, stored with Writer.PublishTx, does not decode: the Stack parks it
//     (ShouldPark) instead of retrying it forever.
//
// Both buses are built on outbox.Writer.Publisher(): a message is stored in the transaction
// of its context (the middleware's, or the front desk's), and the relay forwards it after the
// commit. The relay here publishes every message twice, as a relay that crashed after
// publishing and before saving its position would, so every handler receives every message
// twice; the run ends with one JSON line of what it counted, and fails if any effect is not
// there exactly once.
//
// The broker comes from the environment through package broker (BROKER=sql|kafka|amqp, default
// sql, so only PostgreSQL is needed). With BROKER=kafka and no KAFKA_BROKERS an embedded Kafka
// (kfake) is started. PostgreSQL is DATABASE_URL, else the server on 127.0.0.1:5432, else an
// embedded one started for the run (see internal/embeddedpg).
//
//	go run ./examples/cqrs
//	BROKER=kafka KAFKA_BROKERS=127.0.0.1:9092 go run ./examples/cqrs -bookings 200
//	BROKER=amqp go run ./examples/cqrs
//
// This file is the pattern; setup.go and report.go are the scaffolding around it.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/examples/internal/scaffold"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// The commands and events, as in Watermill's example (JSON here instead of protobuf).
type (
	BookRoom struct {
		BookingID string `json:"booking_id"`
		Hotel     string `json:"hotel"`
		RoomID    string `json:"room_id"`
		Guest     string `json:"guest"`
		Price     int64  `json:"price"`
	}
	RoomBooked struct {
		BookingID string `json:"booking_id"`
		Hotel     string `json:"hotel"`
		RoomID    string `json:"room_id"`
		Guest     string `json:"guest"`
		Price     int64  `json:"price"`
	}
	OrderBeer struct {
		BookingID string `json:"booking_id"`
		Hotel     string `json:"hotel"`
		RoomID    string `json:"room_id"`
		Count     int64  `json:"count"`
	}
	BeerOrdered struct {
		BookingID string `json:"booking_id"`
		Hotel     string `json:"hotel"`
		RoomID    string `json:"room_id"`
		Count     int64  `json:"count"`
	}
)

// The router handler names: the effectively-once middleware scopes its dedupe keys by them (the
// consumer), so renaming one starts it with an empty history.
const (
	bookRoomHandler       = "BookRoomHandler"
	orderBeerHandler      = "OrderBeerHandler"
	orderBeerOnRoomBooked = "OrderBeerOnRoomBooked"
	financialReport       = "FinancialReport"
)

func main() {
	o := options{timeout: 2 * time.Minute, out: os.Stdout}
	flag.IntVar(&o.bookings, "bookings", 50, "bookings the front desk takes")
	flag.StringVar(&o.schema, "schema", pgtx.DefaultSchema, "schema for watermill-once's tables and the hotel's tables")
	verbose := flag.Bool("v", false, "log what Watermill and watermill-once do")
	flag.Parse()
	o.logger = scaffold.Logger(*verbose)
	if err := runFromEnv(o); err != nil { // the broker and PostgreSQL from the environment
		log.Fatal(err)
	}
}

// run takes o.bookings bookings and waits until every handler has seen every message twice.
func run(ctx context.Context, db *sql.DB, o options) (summary, error) {
	// Tables, the broker (subscriptions declared), the outbox Writer, and the relay that
	// forwards the outbox to the broker, every message twice.
	e, err := setUp(ctx, db, o)
	if err != nil {
		return summary{}, err
	}
	defer e.close()

	// Both buses publish through the outbox: Writer.Publisher() stores each message in the
	// transaction of the message's context and refuses one without (pgtx.ErrNoTransaction).
	// Inside a handler that is the middleware's transaction: CommandBus.Send and
	// EventBus.Publish give the message the context they are called with.
	marshaler := cqrs.JSONMarshaler{GenerateName: cqrs.StructName}
	commandBus, err := cqrs.NewCommandBusWithConfig(e.writer.Publisher(), cqrs.CommandBusConfig{
		GeneratePublishTopic: func(p cqrs.CommandBusGeneratePublishTopicParams) (string, error) {
			return e.topic(p.CommandName), nil // one topic per command
		},
		Marshaler: marshaler,
		Logger:    e.logger,
	})
	if err != nil {
		return summary{}, err
	}
	eventBus, err := cqrs.NewEventBusWithConfig(e.writer.Publisher(), cqrs.EventBusConfig{
		GeneratePublishTopic: func(cqrs.GenerateEventPublishTopicParams) (string, error) {
			return e.topic(eventsTopic), nil // every event on one topic
		},
		Marshaler: marshaler,
		Logger:    e.logger,
	})
	if err != nil {
		return summary{}, err
	}

	// The Stack on the router covers every handler the processors add: claim, handler, outbox
	// in one transaction; retries; permanent errors parked. The handlers' writes do not depend
	// on what they read (INSERT, n = n + 1), so READ COMMITTED spares the serialization retries
	// of the report's one row.
	mw, err := once.New(db, once.Config{Schema: o.schema, Outbox: e.writer, TxOptions: &sql.TxOptions{Isolation: sql.LevelReadCommitted}}, e.logger)
	if err != nil {
		return summary{}, err
	}
	stack, err := once.Stack(once.StackConfig{
		Middleware:  mw,
		Logger:      e.logger,
		PoisonTopic: e.topic(poisonTopic),
		// An undecodable message fails in the processor's Unmarshal, before the handler, with a
		// plain error: park it too, or it is retried and nacked forever. ShouldPark replaces the
		// default, so it keeps the default's two tests.
		ShouldPark: func(err error) bool { return wmonce.IsPermanent(err) || wmonce.IsPanic(err) || isDecodeError(err) },
	})
	if err != nil {
		return summary{}, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, e.logger)
	if err != nil {
		return summary{}, err
	}
	router.AddMiddleware(stack...)

	h := &hotel{tables: e.tables, commandBus: commandBus, eventBus: eventBus}
	commands, err := cqrs.NewCommandProcessorWithConfig(router, cqrs.CommandProcessorConfig{
		GenerateSubscribeTopic: func(p cqrs.CommandProcessorGenerateSubscribeTopicParams) (string, error) {
			return e.topic(p.CommandName), nil
		},
		SubscriberConstructor: func(p cqrs.CommandProcessorSubscriberConstructorParams) (message.Subscriber, error) {
			return e.broker.NewSubscriber(p.HandlerName) // a consumer group per handler
		},
		Marshaler: marshaler,
		Logger:    e.logger,
	})
	if err != nil {
		return summary{}, err
	}
	if err := commands.AddHandlers(
		cqrs.NewCommandHandler(bookRoomHandler, h.bookRoom),
		cqrs.NewCommandHandler(orderBeerHandler, h.orderBeer),
	); err != nil {
		return summary{}, err
	}
	// Events share one topic, so each handler also receives the events it does not handle:
	// AckOnUnknownEvent acks them (without it they fail, and the Stack retries and nacks them
	// forever).
	events, err := cqrs.NewEventProcessorWithConfig(router, cqrs.EventProcessorConfig{
		GenerateSubscribeTopic: func(cqrs.EventProcessorGenerateSubscribeTopicParams) (string, error) {
			return e.topic(eventsTopic), nil
		},
		SubscriberConstructor: func(p cqrs.EventProcessorSubscriberConstructorParams) (message.Subscriber, error) {
			return e.broker.NewSubscriber(p.HandlerName)
		},
		AckOnUnknownEvent: true,
		Marshaler:         marshaler,
		Logger:            e.logger,
	})
	if err != nil {
		return summary{}, err
	}
	if err := events.AddHandlers(cqrs.NewEventHandler(orderBeerOnRoomBooked, h.orderBeerOnRoomBooked)); err != nil {
		return summary{}, err
	}
	// A group's handlers share one subscriber and one router handler (the group's name, the
	// middleware's consumer), so they share one transaction per message.
	groups, err := cqrs.NewEventGroupProcessorWithConfig(router, cqrs.EventGroupProcessorConfig{
		GenerateSubscribeTopic: func(cqrs.EventGroupProcessorGenerateSubscribeTopicParams) (string, error) {
			return e.topic(eventsTopic), nil
		},
		SubscriberConstructor: func(p cqrs.EventGroupProcessorSubscriberConstructorParams) (message.Subscriber, error) {
			return e.broker.NewSubscriber(p.EventGroupName)
		},
		AckOnUnknownEvent: true,
		Marshaler:         marshaler,
		Logger:            e.logger,
	})
	if err != nil {
		return summary{}, err
	}
	if err := groups.AddHandlersGroup(financialReport,
		cqrs.NewGroupEventHandler(h.reportRoomBooked),
		cqrs.NewGroupEventHandler(h.reportBeerOrdered),
	); err != nil {
		return summary{}, err
	}
	stopRouter, err := scaffold.StartRouter(ctx, router)
	if err != nil {
		return summary{}, err
	}
	defer stopRouter()

	start := time.Now()
	bookings := e.bookings(o.bookings)
	if err := frontDesk(ctx, db, commandBus, e.tables, bookings); err != nil {
		return summary{}, err
	}
	brokenID, err := sendUndecodable(ctx, db, e.writer, marshaler, e.topic("BookRoom"))
	if err != nil {
		return summary{}, err
	}
	// Every message reaches its handlers twice (the relay publishes it twice): wait until each
	// consumer applied as many messages as it receives and absorbed as many copies, then count
	// the effects. (A consumer that applied twice as many stops the wait too: the count shows it.)
	if err := scaffold.WaitUntil(ctx, o.timeout, func() bool {
		c := mw.Counters()
		for consumer, perBooking := range messagesPerBooking {
			cc, n := c.Consumer(consumer), uint64(perBooking*len(bookings))
			if cc.Fresh < n || (cc.Duplicates < n && cc.Fresh < 2*n) {
				return false
			}
		}
		return true
	}); err != nil {
		return summary{}, fmt.Errorf("%w: the handlers did not receive every copy: %+v", err, mw.Counters().Consumers())
	}
	if err := scaffold.WaitUntil(ctx, o.timeout, func() bool { return e.parked(ctx, brokenID) > 0 }); err != nil {
		return summary{}, fmt.Errorf("%w: the undecodable command %s was not parked", err, brokenID)
	}
	s := summary{Bookings: len(bookings), Broker: string(e.broker.Kind()), Consumers: mw.Counters().Consumers(), Elapsed: time.Since(start)}
	err = e.report(ctx, &s, bookings, brokenID, o.out)
	return s, err
}

// messagesPerBooking is how many distinct messages each consumer receives per booking: one
// command each for the command handlers; RoomBooked and BeerOrdered for the event handlers,
// which share the events topic (OrderBeerOnRoomBooked acks BeerOrdered unhandled).
var messagesPerBooking = map[string]int{bookRoomHandler: 1, orderBeerHandler: 1, orderBeerOnRoomBooked: 2, financialReport: 2}

// frontDesk takes bookings outside any handler. Each request's row and its BookRoom command
// commit together or not at all: pgtx.RunInTx puts its transaction in the context, so the
// handlers' own command bus (Writer.Publisher) stores the command in it, as Writer.PublishTx
// would. There is no transaction outside a handler unless the caller opens one: Send with a
// bare context is refused with pgtx.ErrNoTransaction.
func frontDesk(ctx context.Context, db *sql.DB, commandBus *cqrs.CommandBus, t tables, bookings []BookRoom) error {
	for _, b := range bookings {
		if err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+t.requests+` (booking_id, hotel, guest) VALUES ($1, $2, $3)`, b.BookingID, b.Hotel, b.Guest); err != nil {
				return err
			}
			return commandBus.Send(ctx, &b)
		}); err != nil {
			return fmt.Errorf("front desk: booking %s: %w", b.BookingID, err)
		}
	}
	return nil
}

// sendUndecodable stores a BookRoom command whose payload does not decode (a client on an older
// schema) with Writer.PublishTx, the call for code that holds a *sql.Tx: the marshaler's name
// metadata routes it to BookRoomHandler, whose Unmarshal fails, and the Stack parks it.
func sendUndecodable(ctx context.Context, db *sql.DB, writer *outbox.Writer, marshaler cqrs.CommandEventMarshaler, topic string) (string, error) {
	msg, err := marshaler.Marshal(&BookRoom{})
	if err != nil {
		return "", err
	}
	msg.Payload = []byte(`{"booking_id": 42}`)
	return msg.UUID, pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return writer.PublishTx(ctx, tx, topic, msg)
	})
}

// isDecodeError reports whether err is a JSON payload that does not decode.
func isDecodeError(err error) bool {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	return errors.As(err, &syntax) || errors.As(err, &typ)
}

// hotel holds the handlers. Each runs in the middleware's transaction, which its context
// carries (pgtx.TxFromContext), writes through it, and publishes through the buses, whose
// messages are stored in that same transaction: applied and published once, or not at all.
type hotel struct {
	tables     tables
	commandBus *cqrs.CommandBus
	eventBus   *cqrs.EventBus
}

// txFrom returns the middleware's transaction; without one the handler was wired without the
// Stack, and must not write around it.
func txFrom(ctx context.Context) (*sql.Tx, error) {
	tx, ok := pgtx.TxFromContext(ctx)
	if !ok {
		return nil, fmt.Errorf("handler runs without the effectively-once middleware: %w", pgtx.ErrNoTransaction)
	}
	return tx, nil
}

func (h *hotel) bookRoom(ctx context.Context, cmd *BookRoom) error {
	tx, err := txFrom(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+h.tables.bookings+` (booking_id, hotel, room_id, guest, price) VALUES ($1, $2, $3, $4, $5)`,
		cmd.BookingID, cmd.Hotel, cmd.RoomID, cmd.Guest, cmd.Price); err != nil {
		return err
	}
	return h.eventBus.Publish(ctx, &RoomBooked{BookingID: cmd.BookingID, Hotel: cmd.Hotel, RoomID: cmd.RoomID, Guest: cmd.Guest, Price: cmd.Price})
}

// orderBeerOnRoomBooked sends a command from an event handler: the same bus as the front desk,
// here in the middleware's transaction.
func (h *hotel) orderBeerOnRoomBooked(ctx context.Context, event *RoomBooked) error {
	return h.commandBus.Send(ctx, &OrderBeer{BookingID: event.BookingID, Hotel: event.Hotel, RoomID: event.RoomID, Count: beersFor(event.Price)})
}

func (h *hotel) orderBeer(ctx context.Context, cmd *OrderBeer) error {
	tx, err := txFrom(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+h.tables.beerOrders+` (booking_id, hotel, room_id, beers) VALUES ($1, $2, $3, $4)`,
		cmd.BookingID, cmd.Hotel, cmd.RoomID, cmd.Count); err != nil {
		return err
	}
	return h.eventBus.Publish(ctx, &BeerOrdered{BookingID: cmd.BookingID, Hotel: cmd.Hotel, RoomID: cmd.RoomID, Count: cmd.Count})
}

func (h *hotel) reportRoomBooked(ctx context.Context, event *RoomBooked) error {
	return h.addToReport(ctx, event.Hotel, 1, event.Price, 0)
}

func (h *hotel) reportBeerOrdered(ctx context.Context, event *BeerOrdered) error {
	return h.addToReport(ctx, event.Hotel, 0, 0, event.Count)
}

// addToReport adds to the hotel's running totals: not idempotent on its own, so a copy
// applied twice would show in the report.
func (h *hotel) addToReport(ctx context.Context, hotel string, bookings, revenue, beers int64) error {
	tx, err := txFrom(ctx)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO `+h.tables.reports+` AS r (hotel, bookings, revenue, beers) VALUES ($1, $2, $3, $4)
		ON CONFLICT (hotel) DO UPDATE SET bookings = r.bookings + EXCLUDED.bookings, revenue = r.revenue + EXCLUDED.revenue, beers = r.beers + EXCLUDED.beers`,
		hotel, bookings, revenue, beers)
	return err
}

// beersFor is how many beers a booking orders: 1 to 3, from its price.
func beersFor(price int64) int64 { return price%3 + 1 }
