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
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/pgtx"
)

func main() {
	events := flag.Int("events", 1000, "payment events to publish")
	schema := flag.String("schema", pgtx.DefaultSchema, "schema for watermill-once's tables and the example's cashback table")
	topic := flag.String("topic", "payments", "topic the events are published to")
	verbose := flag.Bool("v", false, "log what Watermill and watermill-once do")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := watermill.LoggerAdapter(watermill.NopLogger{})
	if *verbose {
		logger = watermill.NewStdLogger(false, false)
	}

	getenv := os.Getenv
	if strings.EqualFold(os.Getenv(broker.EnvBroker), string(broker.Kafka)) && os.Getenv(broker.EnvKafkaBrokers) == "" {
		ek, err := broker.StartEmbeddedKafka(ctx, logger)
		if err != nil {
			log.Fatal(err)
		}
		defer ek.Close()
		addrs := strings.Join(ek.Addrs(), ",")
		getenv = func(k string) string {
			if k == broker.EnvKafkaBrokers {
				return addrs
			}
			return os.Getenv(k)
		}
		fmt.Printf("started an embedded Kafka (kfake) at %s\n", addrs)
	}
	brokerConfig, err := broker.ParseEnv(getenv)
	if err != nil {
		log.Fatal(err)
	}
	databaseURL := os.Getenv(broker.EnvDatabaseURL)
	if databaseURL == "" {
		databaseURL = pgtx.DefaultDatabaseURL
	}
	db, err := pgtx.Open(ctx, databaseURL, pgtx.PoolConfig{MaxOpenConns: 16})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	_, err = run(ctx, db, options{
		broker:  brokerConfig,
		schema:  *schema,
		topic:   *topic,
		events:  *events,
		timeout: 2 * time.Minute,
		out:     os.Stdout,
		logger:  logger,
	})
	if err != nil {
		log.Fatal(err)
	}
}
