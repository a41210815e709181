package main

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
)

// TestExample runs the projection over each broker, every transfer delivered twice: each is
// applied once and the malformed event alone fails (and is parked). How big the groups get
// depends on timing (a group forms while every lane is busy), so it is logged, not checked: the
// middleware's own tests form groups with signals (TestBatchHandlerGetsTheGroupsFreshMessagesOnce).
func TestExample(t *testing.T) {
	for _, kind := range []broker.Kind{broker.SQL, broker.Kafka, broker.AMQP} {
		t.Run(string(kind), func(t *testing.T) {
			db := pgtest.DB(t)
			cfg := brokertest.Config(t, kind, pgtest.Schema(t, db))
			runID := watermill.NewShortUUID()
			if kind == broker.Kafka {
				t.Cleanup(func() {
					b, err := broker.New(context.Background(), db, cfg, watermill.NopLogger{})
					if err == nil {
						_ = b.DeleteKafkaTopics("transfers-" + runID)
						_ = b.Close()
					}
				})
			}
			out := io.Writer(io.Discard)
			if testing.Verbose() {
				out = os.Stdout
			}
			s, err := run(context.Background(), db, cfg, runID, out)
			if err != nil {
				t.Fatal(err)
			}
			if s.Events != events || s.Balance != s.Want {
				t.Fatalf("applied %d events, balance %d; want %d events, balance %d: %+v", s.Events, s.Balance, events, s.Want, s)
			}
			if s.Failed != 1 {
				t.Fatalf("%d failed messages, want the malformed one: %+v", s.Failed, s)
			}
			parked := pgtest.Count(t, db, `SELECT count(*) FROM wmonce.outbox WHERE payload->>'uuid' = $1 AND payload->>'destination_topic' = $2`, s.Malformed, once.DefaultPoisonTopic)
			if parked != 1 {
				t.Fatalf("the malformed event is parked %d times, want once", parked)
			}
			t.Logf("%+v", s)
		})
	}
}
