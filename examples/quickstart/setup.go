package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/embeddedpg"
	"github.com/wmonce/watermill-once/pgtx"
)

// env is the quickstart's scaffolding: the database and Watermill's SQL pub/sub on it.
type env struct {
	db     *sql.DB
	broker *broker.Broker
	pub    message.Publisher
	sub    message.Subscriber
	stopDB func() error // stops an embedded PostgreSQL, if one was started

	watchers []message.Subscriber
}

// setUp opens DATABASE_URL, else the server on 127.0.0.1:5432, else an embedded one
// (announced), creates the business table, and Watermill's SQL publisher and subscriber (the
// broker package's, topic tables in schema quickstart_broker).
func setUp(ctx context.Context, logger watermill.LoggerAdapter) (e *env, err error) {
	databaseURL, stopDB, err := embeddedpg.DatabaseURL(ctx, embeddedpg.Options{Out: os.Stdout})
	if err != nil {
		return nil, err
	}
	e = &env{stopDB: stopDB}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.db, err = pgtx.Open(ctx, databaseURL, pgtx.PoolConfig{}); err != nil {
		return e, err
	}
	if _, err := e.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS cashback_credits (
		id bigserial PRIMARY KEY, payment_id text NOT NULL, paise bigint NOT NULL)`); err != nil {
		return e, err
	}
	cfg := broker.Config{Kind: broker.SQL, SQL: broker.SQLConfig{Schema: "quickstart_broker", PollInterval: 50 * time.Millisecond}}
	if e.broker, err = broker.New(ctx, e.db, cfg, logger); err != nil {
		return e, err
	}
	e.pub, e.sub, err = e.broker.NewPubSub(ctx, "rewards")
	return e, err
}

func (e *env) close() {
	for _, sub := range e.watchers {
		_ = sub.Close()
	}
	if e.sub != nil {
		_ = e.sub.Close()
	}
	if e.pub != nil {
		_ = e.pub.Close()
	}
	if e.broker != nil {
		_ = e.broker.Close()
	}
	if e.db != nil {
		_ = e.db.Close()
	}
	_ = e.stopDB()
}

// credits counts the business rows written for paymentID (0 when the query fails: it is retried).
func (e *env) credits(ctx context.Context, paymentID string) int {
	var n int
	_ = e.db.QueryRowContext(ctx, `SELECT count(*) FROM cashback_credits WHERE payment_id = $1`, paymentID).Scan(&n)
	return n
}

// watched counts the messages received on a topic by the UUIDs they were caused by (the
// causation_id the outbox stamps) and by their own UUIDs (parked messages keep theirs).
type watched struct {
	mu  sync.Mutex
	got map[string]int
}

// watch consumes topic as the consumer group "quickstart_audit" until ctx ends.
func (e *env) watch(ctx context.Context, topic string) (*watched, error) {
	sub, err := e.broker.NewSubscriber("quickstart_audit")
	if err != nil {
		return nil, err
	}
	e.watchers = append(e.watchers, sub)
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	w := &watched{got: map[string]int{}}
	go func() {
		for m := range msgs {
			w.mu.Lock()
			w.got[m.UUID]++
			if c := m.Metadata.Get("causation_id"); c != "" {
				w.got[c]++
			}
			w.mu.Unlock()
			m.Ack()
		}
	}()
	return w, nil
}

// count sums the messages seen for ids.
func (w *watched) count(ids ...string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, id := range ids {
		n += w.got[id]
	}
	return n
}

// waitUntil checks cond every 20ms until it holds or timeout passes.
func waitUntil(timeout time.Duration, cond func() bool) error {
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
	}
	return nil
}
