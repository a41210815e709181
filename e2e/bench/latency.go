package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/pgcount"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// End-to-end latency: a producer commits an outbox row at a fixed rate, the outbox Relay
// forwards it to the broker, and an effectively-once consumer applies it. Latency runs from
// the producer's COMMIT returning to the consumer's commit, all with the components' default
// settings (relay, broker, middleware), so it shows what polling costs.

// publishedAtKey is the metadata field in which the relay's publisher records when it was
// handed the message (unix nanoseconds), so the latency can be split into stages.
const publishedAtKey = "bench_published_at"

// stampingPublisher records in each message when the relay handed it to the broker's publisher.
// The relay's copy of the message is built from the outbox row for this Publish call, so the
// stamp changes nothing the relay keeps.
type stampingPublisher struct{ message.Publisher }

func (p stampingPublisher) Publish(topic string, msgs ...*message.Message) error {
	now := strconv.FormatInt(time.Now().UnixNano(), 10)
	for _, m := range msgs {
		m.Metadata.Set(publishedAtKey, now)
	}
	return p.Publisher.Publish(topic, msgs...)
}

// stageTimes is when one event reached the relay's publisher and the consumer's handler chain.
type stageTimes struct{ published, received time.Time }

// Stages splits an e2e variant's latency: from the producer's COMMIT to the relay's Publish
// call (waiting for the relay to wake and read), from that call to the consumer's handler chain
// (the broker's publish and delivery, queueing at the consumer included), and from there to the
// consumer's commit (the middleware's transaction).
type Stages struct {
	ToPublish StageLatency `json:"commit_to_publish"`
	ToDeliver StageLatency `json:"publish_to_handler"`
	ToApply   StageLatency `json:"handler_to_commit"`
}

// StageLatency is one stage's p50 and p99 in milliseconds.
type StageLatency struct {
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
}

func stageOf(d []time.Duration) StageLatency {
	p50, p99 := percentiles(d)
	return StageLatency{P50ms: p50, P99ms: p99}
}

func (s *Stages) String() string {
	return fmt.Sprintf("p50/p99 ms: commit->publish %.1f/%.1f, publish->handler %.1f/%.1f, handler->commit %.1f/%.1f",
		s.ToPublish.P50ms, s.ToPublish.P99ms, s.ToDeliver.P50ms, s.ToDeliver.P99ms, s.ToApply.P50ms, s.ToApply.P99ms)
}

// e2eTopic is the topic of one e2e variant: each has its own, so the second one's group does
// not find the first one's events in its queue.
func e2eTopic(runID, id string) string { return "wb-" + runID + "-" + id }

// e2eRate returns the rate of an e2e variant.
func e2eRate(id string) int {
	if id == E2E1000 || id == CDC1000 {
		return 1000
	}
	return 50
}

// endToEnd runs one e2e variant over the rig's broker.
func (h *harness) endToEnd(ctx context.Context, r *rig, id string) (Result, error) {
	rate := e2eRate(id)
	n := max(1, int(float64(rate)*h.opts.e2eDuration.Seconds()))
	if isBurst(id) {
		n = h.burstEvents()
	}
	res := Result{Variant: id, Broker: r.label(), Messages: n, InFlight: 1}
	if err := cleanSchema(ctx, h.db, h.opts.schema); err != nil {
		return res, err
	}
	// The next variants count business rows and claims: leave none behind.
	defer func() { _ = cleanSchema(context.WithoutCancel(ctx), h.db, h.opts.schema) }()
	topic, group := e2eTopic(r.runID, id), "e2e-"+id
	// The components' defaults; the rig's own settings are tuned for draining backlogs.
	cfg := r.cfg
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: group}}
	cfg.SQL.PollInterval, cfg.SQL.IdlePollInterval = 0, 0
	cfg.SQL.BatchSize = h.opts.e2eSQLBatch             // 0: the default
	cfg.Kafka.Partitions = int32(h.opts.e2ePartitions) // 0: the default, not one per message in flight
	b, err := broker.New(ctx, h.db, cfg, h.logger)
	if err != nil {
		return res, err
	}
	defer b.Close()
	pub, err := b.NewPublisher(ctx)
	if err != nil {
		return res, err
	}
	defer pub.Close()
	sub, err := b.NewSubscriber(group)
	if err != nil {
		return res, err
	}
	relay, err := h.newForwarder(ctx, r, id, pub) // the Relay, or Debezium (cdc.go)
	if err != nil {
		_ = sub.Close()
		return res, err
	}
	consumer := "bench-" + id + "-" + r.label()
	eoCfg := once.Config{Schema: h.opts.schema, Consumer: consumer}
	eoCfg.GroupCommit = once.GroupCommitConfig{Disabled: h.opts.e2eNoGroup, Workers: h.opts.groupWorkers}
	eo, err := once.New(h.db, eoCfg, h.logger)
	if err != nil {
		_ = sub.Close()
		return res, err
	}
	defer eo.Close()

	var produced, consumed sync.Map // uuid -> time.Time
	var stages sync.Map             // uuid -> stageTimes: when the relay published it and the consumer got it
	warmUUID := "warmup-" + watermill.NewUUID()
	var consumedN atomic.Int64
	allIn := make(chan struct{})
	warm := make(chan struct{})
	var warmOnce sync.Once
	measure := func(hf message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			received := time.Now()
			out, err := hf(msg)
			switch {
			case err != nil:
			case msg.UUID == warmUUID:
				warmOnce.Do(func() { close(warm) })
			default:
				if _, loaded := consumed.LoadOrStore(msg.UUID, time.Now()); !loaded {
					if ns, perr := strconv.ParseInt(msg.Metadata.Get(publishedAtKey), 10, 64); perr == nil {
						stages.Store(msg.UUID, stageTimes{published: time.Unix(0, ns), received: received})
					}
					if consumedN.Add(1) == int64(n) {
						close(allIn)
					}
				}
			}
			return out, err
		}
	}
	insert := `INSERT INTO ` + pgtx.QualifiedName(h.opts.schema, "bench_effects") + ` (message_id, payload) VALUES ($1, $2)`
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, h.logger)
	if err != nil {
		_ = sub.Close()
		return res, err
	}
	router.AddConsumerHandler("e2e", topic, sub, func(msg *message.Message) error {
		tx, ok := pgtx.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no transaction in the message context")
		}
		_, err := tx.ExecContext(msg.Context(), insert, msg.UUID, msg.Payload)
		return err
	}).AddMiddleware(measure, eo.Middleware)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerErr := make(chan error, 1)
	go func() { routerErr <- router.Run(runCtx) }()
	relayErr := make(chan error, 1)
	go func() { relayErr <- relay.Run(runCtx) }()
	defer func() {
		quiet.Store(true)
		_ = relay.Close()
		h.drain("relay", relayErr)
		_ = router.Close()
		cancel()
		h.drain("router", routerErr)
		quiet.Store(false)
	}()
	select {
	case <-router.Running():
	case err := <-routerErr:
		return res, fmt.Errorf("router stopped: %w", err)
	}

	writer, err := outbox.NewWriter(outbox.Config{Schema: h.opts.schema, ValidateTopic: broker.TopicValidator(r.kind)})
	if err != nil {
		return res, err
	}
	// One event through the whole path first: consumer group joins, connections and
	// prepared statements are not what this measures.
	if err := pgtx.RunInTx(ctx, h.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return writer.PublishTx(ctx, tx, topic, message.NewMessage(warmUUID, payload(0)))
	}); err != nil {
		return res, fmt.Errorf("warm-up event: %w", err)
	}
	if err := waitDone(ctx, warm, h.opts.variantTimeout, func() string { return "warm-up event not applied" }); err != nil {
		return res, err
	}
	// Producers: one transaction per event, started on a fixed schedule; enough workers that a
	// slow commit does not delay the next event's start.
	type job struct{ msgs []*message.Message }
	jobs := make(chan job, n)
	var prodErr atomic.Value
	var wg sync.WaitGroup
	for range min(64, max(4, rate/25)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				err := pgtx.RunInTx(ctx, h.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
					return writer.PublishTx(ctx, tx, topic, j.msgs...)
				})
				if err != nil {
					prodErr.CompareAndSwap(nil, err)
					continue
				}
				now := time.Now()
				for _, m := range j.msgs {
					produced.Store(m.UUID, now)
				}
			}
		}()
	}
	meas := h.startMeasuring(r.label() + "-" + id)
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	msgs := make([]*message.Message, n)
	for i := range n {
		msgs[i] = message.NewMessage(watermill.NewUUID(), payload(i))
	}
	for i, batch := range producerBatches(id, msgs) {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 && !isBurst(id) {
			time.Sleep(d)
		}
		jobs <- job{batch}
	}
	close(jobs)
	wg.Wait()
	producing := time.Since(start)
	if err, _ := prodErr.Load().(error); err != nil {
		return res, fmt.Errorf("producer: %w", err)
	}
	err = waitDone(ctx, allIn, h.opts.variantTimeout, func() string {
		return fmt.Sprintf("consumer applied %d of %d", consumedN.Load(), n)
	})
	meas.stop(&res)
	if err != nil {
		return res, err
	}
	var lat, toPublish, toDeliver, toApply []time.Duration
	produced.Range(func(k, v any) bool {
		if c, ok := consumed.Load(k); ok {
			lat = append(lat, c.(time.Time).Sub(v.(time.Time)))
			if sv, ok := stages.Load(k); ok {
				st := sv.(stageTimes)
				toPublish = append(toPublish, st.published.Sub(v.(time.Time)))
				toDeliver = append(toDeliver, st.received.Sub(st.published))
				toApply = append(toApply, c.(time.Time).Sub(st.received))
			}
		}
		return true
	})
	if len(lat) != n {
		return res, fmt.Errorf("%d of %d events have both a producer commit and a consumer commit", len(lat), n)
	}
	p50, p99 := percentiles(lat)
	res.P50ms, res.P99ms = ms(p50), ms(p99)
	res.Seconds = producing.Seconds()
	res.MsgsPerSec = float64(n) / producing.Seconds()
	res.Notes = fmt.Sprintf("target %d events/s for %s; latency from the producer's COMMIT (outbox row) through the Relay and the broker to the effectively-once consumer's commit; relay, broker and middleware defaults", rate, h.opts.e2eDuration)
	if isBurst(id) { // throughput from the first commit to the last consumer commit
		res.Seconds = time.Since(start).Seconds()
		res.MsgsPerSec = float64(n) / res.Seconds
		res.Notes = fmt.Sprintf("%d events committed %d per transaction by %d producers as fast as they go; msgs/s from the first commit to the last consumer commit", n, burstBatch, min(64, max(4, rate/25)))
	}
	if viaDebezium(id) {
		res.Notes += "; forwarded by Debezium 3.6.1 on Kafka Connect 4.3.1 (2 workers), not the Relay"
	}
	if r.kind == broker.SQL {
		res.Notes += "; SQL: the middleware applies in the subscriber's transaction, which commits right after the ack (not included)"
	}
	if len(toPublish) > 0 {
		res.Stages = &Stages{ToPublish: stageOf(toPublish), ToDeliver: stageOf(toDeliver), ToApply: stageOf(toApply)}
	}
	return res, nil
}

// idleQueries measures, with no traffic at all, the queries per second issued by an outbox
// Relay and by one SQL-broker subscription (with wake-ups, and with them disabled, as
// watermill-sql polls), each on a pool of its own whose queries are counted at the wire.
func (h *harness) idleQueries(ctx context.Context) ([]Result, error) {
	window := h.opts.idleWindow
	var results []Result
	measure := func(id, notes string, start func(db *sql.DB) (stop func(), err error)) error {
		var c pgcount.Counter
		db, err := pgcount.Open(ctx, h.dsn, 4, &c, nil)
		if err != nil {
			return err
		}
		defer db.Close()
		stop, err := start(db)
		if err != nil {
			return err
		}
		defer stop()
		// Let the component start (connect, declare, LISTEN) before counting.
		time.Sleep(min(time.Second, window/2))
		before := c.Count()
		time.Sleep(window)
		q := float64(c.Count()-before) / window.Seconds()
		results = append(results, Result{
			Variant: id, Broker: "postgres", Seconds: window.Seconds(), QueriesPerSec: &q,
			Notes: fmt.Sprintf("%s; %d queries in %s, counted at the wire (simple queries and extended-protocol syncs, pgx liveness pings included)", notes, c.Count()-before, window),
		})
		return nil
	}
	if err := cleanSchema(ctx, h.db, h.opts.schema); err != nil {
		return nil, err
	}
	if h.wants(IdleRelay) {
		err := measure(IdleRelay, "outbox Relay, default RelayConfig, empty outbox", func(db *sql.DB) (func(), error) {
			relay, err := outbox.NewRelay(db, nopPublisher{}, outbox.RelayConfig{Schema: h.opts.schema, Name: "wb-" + h.runID + "-idle"}, h.logger)
			if err != nil {
				return nil, err
			}
			done := make(chan error, 1)
			go func() { done <- relay.Run(ctx) }()
			return func() { _ = relay.Close(); h.drain("idle relay", done) }, nil
		})
		if err != nil {
			return results, err
		}
	}
	topic := "wb-" + h.runID + "-idle"
	defer func() {
		for _, t := range []string{"watermill_" + topic, "watermill_offsets_" + topic} {
			_, _ = h.db.ExecContext(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+pgtx.QualifiedName(h.opts.schema, t))
		}
	}()
	for _, v := range []struct {
		id, notes string
		disable   bool
	}{
		{IdleSQLSub, "one SQL-broker subscription, default SQLConfig (LISTEN/NOTIFY wake-ups, IdlePollInterval fallback), empty topic", false},
		{IdleSQLPoll, "one SQL-broker subscription with DisableListen (polls every PollInterval, default 100ms, as watermill-sql does), empty topic", true},
	} {
		if !h.wants(v.id) {
			continue
		}
		err := measure(v.id, v.notes, func(db *sql.DB) (func(), error) {
			b, err := broker.New(ctx, db, broker.Config{Kind: broker.SQL, SQL: broker.SQLConfig{Schema: h.opts.schema, DisableListen: v.disable},
				Subscriptions: []broker.Subscription{{Topic: topic, Group: "idle"}}}, h.logger)
			if err != nil {
				return nil, err
			}
			if err := b.Declare(ctx, broker.Subscription{Topic: topic, Group: "idle"}); err != nil {
				_ = b.Close()
				return nil, err
			}
			sub, err := b.NewSubscriber("idle")
			if err != nil {
				_ = b.Close()
				return nil, err
			}
			subCtx, cancel := context.WithCancel(ctx)
			if _, err := sub.Subscribe(subCtx, topic); err != nil {
				cancel()
				_ = sub.Close()
				_ = b.Close()
				return nil, err
			}
			return func() { quiet.Store(true); cancel(); _ = sub.Close(); _ = b.Close(); quiet.Store(false) }, nil
		})
		if err != nil {
			return results, err
		}
	}
	return results, nil
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }
