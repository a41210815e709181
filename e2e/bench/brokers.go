package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/pgtx"
)

// rig is one broker prepared for a run: the messages are published once to its topics, and
// every consuming variant reads all of them with a consumer group of its own.
//
// In-flight messages: Watermill keeps one message in flight per Kafka partition and per
// watermill-sql subscription; our RabbitMQ subscriber keeps AMQPConfig.Workers per
// subscription. So the topic has inFlight partitions (Kafka), the group's queue has
// inFlight/Workers subscriptions (RabbitMQ, at least one), or the messages are spread over
// inFlight topics with one subscription each (SQL): every variant sees the same concurrency.
type rig struct {
	kind     broker.Kind
	cfg      broker.Config
	b        *broker.Broker
	pub      message.Publisher
	db       *sql.DB
	schema   string
	runID    string
	inFlight int
	topics   []string
	groups   []string
	extra    []broker.Subscription // relay destinations
	note     string
	logger   watermill.LoggerAdapter
	// legacy is a rig with the settings before issue 14: RabbitMQ Prefetch 1 and Workers
	// 1, SQL subscribers polling (DisableListen).
	legacy bool
}

// label names the rig in results: the broker kind, or "amqp-p1c1" / "sql-poll" for the
// legacy settings.
func (r *rig) label() string {
	switch {
	case r.legacy && r.kind == broker.AMQP:
		return "amqp-p1c1"
	case r.legacy:
		return string(r.kind) + "-poll"
	}
	return string(r.kind)
}

// perHandler is how many messages one subscription has in flight (RabbitMQ: Workers).
func (r *rig) perHandler() int {
	if r.kind == broker.AMQP {
		return r.cfg.AMQP.Workers
	}
	return 1
}

// messagesInFlight is how many messages the rig's consumers have in flight at most.
func (r *rig) messagesInFlight() int {
	if r.kind == broker.AMQP {
		return r.handlersPerTopic() * r.perHandler()
	}
	return r.inFlight
}

// handlersPerTopic is how many router handlers consume each topic: RabbitMQ gets enough
// subscriptions of Workers messages each to have inFlight in flight (at least one).
func (r *rig) handlersPerTopic() int {
	if r.kind == broker.AMQP {
		return max(1, r.inFlight/r.perHandler())
	}
	return 1
}

func (r *rig) group(variant string) string {
	return "wb-" + r.runID + "-" + strings.ToLower(variant)
}

type rigOptions struct {
	kind        broker.Kind
	databaseURL string
	schema      string
	runID       string
	inFlight    int
	variants    []string // consuming variants, each gets a group declared before publishing
	kafkaAddrs  []string // embedded broker, when KAFKA_BROKERS is unset
	kafkaNote   string
	sqlBatch    int
	relayTopics []string
	extraSubs   []broker.Subscription // declared and removed with the rig (e2e topics)
	legacyAMQP  bool                  // the legacy settings (RabbitMQ and SQL; see rig.legacy)
}

func newRig(ctx context.Context, db *sql.DB, o rigOptions, logger watermill.LoggerAdapter) (*rig, error) {
	r := &rig{kind: o.kind, db: db, schema: o.schema, runID: o.runID, inFlight: o.inFlight, logger: logger, legacy: o.legacyAMQP}
	cfg := broker.Config{Kind: o.kind, DatabaseURL: o.databaseURL}
	switch o.kind {
	case broker.SQL:
		cfg.SQL.Schema = o.schema
		cfg.SQL.BatchSize = o.sqlBatch
		cfg.SQL.PollInterval = 20 * time.Millisecond
		for i := range o.inFlight {
			r.topics = append(r.topics, fmt.Sprintf("wb-%s-%d", o.runID, i))
		}
		r.note = fmt.Sprintf("watermill-sql, %d topic tables x 1 subscription, batch %d", o.inFlight, o.sqlBatch)
		if o.legacyAMQP {
			cfg.SQL.DisableListen = true
			r.note += ", DisableListen (polling)"
		}
	case broker.Kafka:
		cfg.Kafka.Brokers = o.kafkaAddrs
		cfg.Kafka.Partitions = int32(o.inFlight)
		cfg.Kafka.SessionTimeout = 6 * time.Second
		r.topics = []string{"wb-" + o.runID}
		r.note = fmt.Sprintf("%s, 1 topic x %d partitions", o.kafkaNote, o.inFlight)
	case broker.AMQP:
		cfg.AMQP.URL = broker.DefaultAMQPURL
		if v := os.Getenv(broker.EnvAMQPURL); v != "" {
			cfg.AMQP.URL = v
		}
		cfg.AMQP.Prefix = "wmonce-bench-" + o.runID + "."
		r.topics = []string{"wb-" + o.runID}
		if o.legacyAMQP {
			cfg.AMQP.Prefetch, cfg.AMQP.Workers = 1, 1
		}
	}
	for _, v := range o.variants {
		g := r.group(v)
		r.groups = append(r.groups, g)
		for _, t := range r.topics {
			cfg.Subscriptions = append(cfg.Subscriptions, broker.Subscription{Topic: t, Group: g})
		}
	}
	for _, t := range o.relayTopics {
		s := broker.Subscription{Topic: t, Group: "sink"}
		r.extra = append(r.extra, s)
		cfg.Subscriptions = append(cfg.Subscriptions, s)
	}
	for _, s := range o.extraSubs {
		r.extra = append(r.extra, s)
		// A Kafka topic keeps the partitions it is created with: the e2e variant creates its
		// own with the broker's default (or -e2e-partitions), not the rig's one per message in
		// flight, which would hide what the default gives.
		if o.kind != broker.Kafka {
			cfg.Subscriptions = append(cfg.Subscriptions, s)
		}
	}
	b, err := broker.New(ctx, db, cfg, logger)
	if err != nil {
		return nil, err
	}
	r.b, r.cfg = b, b.Config()
	if o.kind == broker.AMQP {
		a := r.cfg.AMQP
		r.note = fmt.Sprintf("RabbitMQ quorum queue per group, %d subscriptions x Workers %d, Prefetch %d, publisher confirms", r.handlersPerTopic(), a.Workers, a.Prefetch)
	}
	if r.pub, err = b.NewPublisher(ctx); err != nil {
		_ = b.Close()
		return nil, err
	}
	return r, nil
}

// payload returns 256 bytes, different for each message.
func payload(i int) []byte {
	p := make([]byte, 256)
	copy(p, fmt.Sprintf(`{"seq":%d,"pad":"`, i))
	for j := range p {
		if p[j] == 0 {
			p[j] = 'x'
		}
	}
	p[254], p[255] = '"', '}'
	return p
}

// publishAll publishes n messages with fresh UUIDs and 256-byte payloads, spread over the
// rig's topics, from several goroutines (the order does not matter here).
func (r *rig) publishAll(ctx context.Context, n int) error {
	const chunk = 250
	type job struct {
		topic string
		msgs  []*message.Message
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if err := r.pub.Publish(j.topic, j.msgs...); err != nil {
					mu.Lock()
					firstErr = errors.Join(firstErr, err)
					mu.Unlock()
				}
			}
		}()
	}
	perTopic := make([][]*message.Message, len(r.topics))
	for i := range n {
		t := i % len(r.topics)
		perTopic[t] = append(perTopic[t], message.NewMessage(watermill.NewUUID(), payload(i)))
		if len(perTopic[t]) == chunk {
			jobs <- job{r.topics[t], perTopic[t]}
			perTopic[t] = nil
		}
	}
	for t, msgs := range perTopic {
		if len(msgs) > 0 {
			jobs <- job{r.topics[t], msgs}
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("publish to %s: %w", r.kind, firstErr)
	}
	if r.kind == broker.SQL {
		// Rows are readable once every older transaction on the server has ended.
		return waitVisible(ctx, r.db, r.schema, r.sqlTables(), n)
	}
	return nil
}

func (r *rig) sqlTables() []string {
	var out []string
	for _, t := range r.topics {
		out = append(out, "watermill_"+t)
	}
	return out
}

// waitVisible waits until n rows of the tables (watermill-sql layout) are older than every
// running transaction, which is when readers of that layout can see them. A long transaction
// elsewhere on the server would otherwise be measured as a slow consumer.
func waitVisible(ctx context.Context, db *sql.DB, schema string, tables []string, n int) error {
	var parts []string
	for _, t := range tables {
		parts = append(parts, `(SELECT count(*) FROM `+pgtx.QualifiedName(schema, t)+` WHERE transaction_id < pg_snapshot_xmin(pg_current_snapshot()))`)
	}
	q := `SELECT ` + strings.Join(parts, " + ")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var got int
		if err := db.QueryRowContext(ctx, q).Scan(&got); err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d rows visible after 2 minutes: a long transaction on the server holds them back (see pg_stat_activity)", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// close removes everything the rig declared: SQL topic tables, Kafka topics, RabbitMQ queues
// and exchanges (with the alternate exchange and queue for unrouted messages).
func (r *rig) close(ctx context.Context) error {
	var errs []error
	errs = append(errs, r.pub.Close())
	switch r.kind {
	case broker.SQL:
		var tables []string
		for _, t := range append(r.topics, r.extraTopics()...) {
			tables = append(tables, "watermill_"+t, "watermill_offsets_"+t)
		}
		for _, t := range tables {
			if _, err := r.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+pgtx.QualifiedName(r.schema, t)); err != nil {
				errs = append(errs, err)
			}
		}
	case broker.Kafka:
		errs = append(errs, r.b.DeleteKafkaTopics(append(r.topics, r.extraTopics()...)...))
	case broker.AMQP:
		var subs []broker.Subscription
		for _, t := range r.topics {
			for _, g := range r.groups {
				subs = append(subs, broker.Subscription{Topic: t, Group: g})
			}
		}
		subs = append(subs, r.extra...)
		errs = append(errs, r.b.DeleteAMQPTopology(subs...))
		errs = append(errs, r.deleteUnrouted())
	}
	errs = append(errs, r.b.Close())
	return errors.Join(errs...)
}

func (r *rig) extraTopics() []string {
	var out []string
	for _, s := range r.extra {
		out = append(out, s.Topic)
	}
	return out
}

// deleteUnrouted deletes the alternate exchange and queue the broker package declares under
// the run's prefix (DeleteAMQPTopology leaves them).
func (r *rig) deleteUnrouted() error {
	conn, err := amqp.Dial(r.cfg.AMQP.URL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	name := r.cfg.AMQP.UnroutedQueueName()
	if _, err := ch.QueueDelete(name, false, false, false); err != nil {
		return err
	}
	return ch.ExchangeDelete(name, false, false)
}
