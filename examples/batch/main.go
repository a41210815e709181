// Command batch runs a projection with a batch handler (projection.go): transfer events,
// each delivered twice, are applied to account balances with one multi-row INSERT per group
// of messages, and a malformed event is parked while the events around it are applied.
//
//	go run ./examples/batch                  # Watermill's SQL pub/sub
//	BROKER=kafka KAFKA_BROKERS=127.0.0.1:9092 go run ./examples/batch
//	BROKER=amqp go run ./examples/batch
//
// It needs PostgreSQL at DATABASE_URL, else on 127.0.0.1:5432, else an embedded one. It ends
// with one JSON line of what it measured.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/examples/internal/scaffold"
	"github.com/wmonce/watermill-once/internal/embeddedpg"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/pgtx"
)

func main() {
	if err := runFromEnv(); err != nil {
		log.Fatal(err)
	}
}

// runFromEnv runs the example with the broker from BROKER and friends, until it ends or Ctrl-C.
func runFromEnv() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// As the other examples: BROKER=kafka without KAFKA_BROKERS starts an embedded Kafka.
	cfg, stopKafka, err := scaffold.BrokerFromEnv(ctx, watermill.NopLogger{}, os.Stdout)
	defer stopKafka()
	if err != nil {
		return err
	}
	databaseURL, stopDB, err := embeddedpg.DatabaseURL(ctx, embeddedpg.Options{Out: os.Stdout})
	if err != nil {
		return err
	}
	defer func() { _ = stopDB() }()
	db, err := pgtx.Open(ctx, databaseURL, pgtx.PoolConfig{})
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = run(ctx, db, cfg, watermill.NewShortUUID(), os.Stdout)
	return err
}

const (
	events   = 400
	accounts = 10
)

// summary is what run measured.
type summary struct {
	Deliveries   int     `json:"deliveries"`
	Events       int     `json:"events_applied"`
	Balance      int64   `json:"balance_cents"`
	Want         int64   `json:"want_cents"`
	Duplicates   uint64  `json:"duplicates_skipped"`
	Failed       uint64  `json:"failed_and_parked"`
	AvgGroupSize float64 `json:"avg_group_size"`
	Malformed    string  `json:"malformed_id"`
}

// run publishes every transfer twice and a malformed one, runs the projection until every
// transfer is applied, and prints the summary.
func run(ctx context.Context, db *sql.DB, cfg broker.Config, runID string, out io.Writer) (s summary, err error) {
	logger := watermill.NopLogger{}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m, err := migrate.New(db, migrate.Config{}, logger)
	if err != nil {
		return s, err
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		return s, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS account_balances (
		account text PRIMARY KEY, cents bigint NOT NULL, events int NOT NULL)`); err != nil {
		return s, err
	}
	b, err := broker.New(ctx, db, cfg, logger)
	if err != nil {
		return s, err
	}
	defer b.Close()
	topic := "transfers-" + runID
	pub, sub, err := b.NewPubSub(ctx, "balances-"+runID)
	if err != nil {
		return s, err
	}
	defer pub.Close()
	if err := b.Declare(ctx, broker.Subscription{Topic: topic, Group: "balances-" + runID}); err != nil {
		return s, err
	}
	mw, err := runProjection(ctx, db, topic, sub, logger)
	if err != nil {
		return s, err
	}
	defer mw.Close()

	account := func(i int) string { return fmt.Sprintf("%s-acct-%d", runID, i%accounts) }
	var batch []*message.Message
	for i := range events {
		payload := fmt.Sprintf(`{"account":%q,"cents":%d}`, account(i), i+1)
		s.Want += int64(i + 1)
		id := watermill.NewUUID()
		batch = append(batch, message.NewMessage(id, []byte(payload)), message.NewMessage(id, []byte(payload))) // a copy: a producer retry
		if i == events/2 {
			s.Malformed = watermill.NewUUID()
			batch = append(batch, message.NewMessage(s.Malformed, []byte(`not json`)))
		}
	}
	s.Deliveries = len(batch)
	if err := pub.Publish(topic, batch...); err != nil {
		return s, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := db.QueryRowContext(ctx, `SELECT coalesce(sum(events), 0), coalesce(sum(cents), 0) FROM account_balances WHERE account LIKE $1`, runID+"-%").Scan(&s.Events, &s.Balance)
		if err != nil {
			return s, err
		}
		c := mw.Counters().Consumer("balances")
		s.Duplicates, s.Failed = c.Duplicates, c.Failed
		if s.Events >= events && s.Duplicates >= events && s.Failed >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c := mw.Counters(); c.GroupCommitTransactions > 0 {
		s.AvgGroupSize = float64(c.GroupCommitMessages) / float64(c.GroupCommitTransactions)
	}
	batches := fmt.Sprintf("%.1f messages per group transaction", s.AvgGroupSize)
	if s.AvgGroupSize == 0 {
		batches = "batches of one: watermill-sql delivers one message at a time, in its own transaction"
	}
	fmt.Fprintf(out, "%d deliveries over %s: %d transfers applied once each (balance %d cents, want %d), %d copies skipped, %d malformed event failed alone (the Stack parks it); %s\n",
		s.Deliveries, cfg.Kind, s.Events, s.Balance, s.Want, s.Duplicates, s.Failed, batches)
	return s, json.NewEncoder(out).Encode(s)
}
