package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/examples/internal/scaffold"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// TestExample runs the example against each broker (SQL on PostgreSQL, Kafka on KAFKA_BROKERS
// or an embedded kfake, RabbitMQ in a throw-away vhost), its relay publishing every message
// twice: every handler absorbs a copy of every message, every effect (rows, the report's sums,
// the commands and events in the outbox) is there exactly once, and the undecodable command is
// parked.
func TestExample(t *testing.T) {
	t.Parallel()
	for _, kind := range broker.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			db := pgtest.DB(t)
			schema := pgtest.Schema(t, db)
			cfg := brokertest.Config(t, kind, schema)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			const bookings = 30
			o := options{broker: cfg, schema: schema, bookings: bookings, timeout: 90 * time.Second, out: &out, runID: scaffold.RunID("hotel-")}
			if kind == broker.Kafka {
				t.Cleanup(func() { deleteKafkaTopics(t, cfg, o.runID) })
			}
			s, err := run(ctx, db, o)
			t.Log("\n" + out.String())
			require.NoError(t, err)

			for consumer, perBooking := range messagesPerBooking {
				c := s.Consumers[consumer]
				require.GreaterOrEqual(t, c.Duplicates, uint64(perBooking*bookings), "%s: a copy of every message was absorbed", consumer)
			}
			require.Equal(t, bookings, s.Requests)
			require.Equal(t, bookings, s.BookingRows)
			require.Equal(t, bookings, s.BeerOrders)
			require.Equal(t, int64(bookings), s.ReportBookings)
			require.Equal(t, s.WantRevenue, s.Revenue)
			require.Equal(t, s.WantBeers, s.Beers)
			require.Equal(t, map[string]int{"BookRoom": bookings, "RoomBooked": bookings, "OrderBeer": bookings, "BeerOrdered": bookings}, s.Outbox)
			require.GreaterOrEqual(t, s.Parked, 1, "the undecodable command is parked (ShouldPark), not retried forever")
		})
	}
}

func deleteKafkaTopics(t *testing.T, cfg broker.Config, runID string) {
	b, err := broker.New(context.Background(), nil, cfg, nil)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer b.Close()
	if err := b.DeleteKafkaTopics(runID+".BookRoom", runID+".OrderBeer", runID+"."+eventsTopic, runID+"."+poisonTopic); err != nil {
		t.Logf("cleanup: %v", err)
	}
}

// A bus on Writer.Publisher() stores a message only in the transaction of its context: sent
// with a bare context (code outside a handler that opened no transaction) it is refused, not
// sent around the transaction. docs/porting.md tells porting users so.
func TestBusOutsideATransactionIsRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	writer, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	bus, err := cqrs.NewCommandBusWithConfig(writer.Publisher(), cqrs.CommandBusConfig{
		GeneratePublishTopic: func(cqrs.CommandBusGeneratePublishTopicParams) (string, error) { return "commands", nil },
		Marshaler:            cqrs.JSONMarshaler{},
	})
	require.NoError(t, err)
	require.ErrorIs(t, bus.Send(context.Background(), &BookRoom{BookingID: "b-1"}), pgtx.ErrNoTransaction)
}
