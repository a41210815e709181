package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// countingPublisher forwards to the broker publisher and notes when the first call began and
// when the want-th message was accepted.
type countingPublisher struct {
	message.Publisher
	want  int64
	n     atomic.Int64
	calls atomic.Int64
	first atomic.Int64
	last  atomic.Int64
	done  chan struct{}
	once  sync.Once
}

func newCountingPublisher(pub message.Publisher, want int) *countingPublisher {
	return &countingPublisher{Publisher: pub, want: int64(want), done: make(chan struct{})}
}

func (c *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	c.first.CompareAndSwap(0, time.Now().UnixNano())
	if err := c.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	c.calls.Add(1)
	if c.n.Add(int64(len(msgs))) >= c.want {
		c.once.Do(func() {
			c.last.Store(time.Now().UnixNano())
			close(c.done)
		})
	}
	return nil
}

func (c *countingPublisher) Close() error { return nil } // the rig closes the real one

// relayTopics are the destinations of the relay and of the forwarder on a rig.
func relayTopics(runID string) (relay, fwd string) {
	return "wb-" + runID + "-relay", "wb-" + runID + "-fwd"
}

// relayVsForwarder stores the same n messages (256-byte payloads, envelope format) once in the
// outbox and once in a watermill-sql topic for Watermill's forwarder, then lets each forward
// them to the rig's broker publisher, one after the other.
func (h *harness) relayVsForwarder(ctx context.Context, r *rig) ([]Result, error) {
	n := h.opts.relayRows
	relayTopic, fwdTopic := relayTopics(r.runID)
	fwdIn := "wb-" + r.runID + "-fwdin"

	writer, err := outbox.NewWriter(outbox.Config{Schema: h.opts.schema, ValidateTopic: broker.TopicValidator(r.kind)})
	if err != nil {
		return nil, err
	}
	for start := 0; start < n; start += 1000 {
		msgs := batch(start, min(start+1000, n))
		if err := pgtx.RunInTx(ctx, h.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
			return writer.PublishTx(ctx, tx, relayTopic, msgs...)
		}); err != nil {
			return nil, fmt.Errorf("fill outbox: %w", err)
		}
	}
	// The forwarder reads a watermill-sql topic (in the bench schema, whatever the broker
	// under test): Watermill's SQL Pub/Sub through the broker package, batch 100 like the relay.
	sqlBroker, err := broker.New(ctx, h.db, broker.Config{Kind: broker.SQL, SQL: broker.SQLConfig{
		Schema: h.opts.schema, BatchSize: 100, PollInterval: 20 * time.Millisecond,
	}}, h.logger)
	if err != nil {
		return nil, err
	}
	defer sqlBroker.Close()
	defer func() {
		for _, t := range []string{"watermill_" + fwdIn, "watermill_offsets_" + fwdIn} {
			_, _ = h.db.ExecContext(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+pgtx.QualifiedName(h.opts.schema, t))
		}
	}()
	sqlPub, err := sqlBroker.NewPublisher(ctx)
	if err != nil {
		return nil, err
	}
	defer sqlPub.Close()
	envelopes := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: fwdIn})
	for start := 0; start < n; start += 1000 {
		if err := envelopes.Publish(fwdTopic, batch(start, min(start+1000, n))...); err != nil {
			return nil, fmt.Errorf("fill forwarder topic: %w", err)
		}
	}
	if err := waitVisible(ctx, h.db, h.opts.schema, []string{"outbox"}, n); err != nil {
		return nil, err
	}
	if err := waitVisible(ctx, h.db, h.opts.schema, []string{"watermill_" + fwdIn}, n); err != nil {
		return nil, err
	}

	var results []Result
	// Our relay: each variant forwards the whole outbox under a relay name of its own.
	for _, id := range []string{Relay, RelayLane} {
		if !h.wants(id) {
			continue
		}
		res := Result{Variant: id, Broker: r.label(), Messages: n, InFlight: 1}
		cp := newCountingPublisher(r.pub, n)
		cfg := outbox.RelayConfig{Schema: h.opts.schema, Name: "wb-" + r.runID + "-" + id, PollInterval: 10 * time.Millisecond, BatchSize: h.opts.relayBatch}
		if id == RelayLane {
			cfg.PublishLanes = h.opts.relayLanes
			res.InFlight = h.opts.relayLanes
		}
		relay, err := outbox.NewRelay(h.db, cp, cfg, h.logger)
		if err != nil {
			return nil, err
		}
		if cfg.BatchSize == 0 {
			cfg.BatchSize = 1000 // the default, for the notes
		}
		meas := h.startMeasuring(string(r.kind) + "-" + Relay)
		runErr := make(chan error, 1)
		go func() { runErr <- relay.Run(ctx) }()
		err = waitDone(ctx, cp.done, h.opts.variantTimeout, func() string {
			return fmt.Sprintf("relay forwarded %d of %d", cp.n.Load(), n)
		})
		meas.stop(&res)
		_ = relay.Close()
		h.drain("relay", runErr)
		if err != nil {
			return nil, err
		}
		el := time.Duration(cp.last.Load() - cp.first.Load())
		res.Seconds, res.MsgsPerSec = el.Seconds(), float64(n)/el.Seconds()
		res.Notes = fmt.Sprintf("BatchSize %d, PublishLanes %d; %.1f msgs per Publish call", cfg.BatchSize, max(cfg.PublishLanes, 1), float64(n)/float64(max(cp.calls.Load(), 1)))
		results = append(results, res)
	}
	// Watermill's forwarder.
	if h.wants(Forwarder) {
		res := Result{Variant: Forwarder, Broker: r.label(), Messages: n, InFlight: 1}
		cp := newCountingPublisher(r.pub, n)
		// The forwarder's router closes the subscriber when it stops.
		sub, err := sqlBroker.NewSubscriber("wb-" + r.runID + "-fwd")
		if err != nil {
			return nil, err
		}
		f, err := forwarder.NewForwarder(sub, cp, h.logger, forwarder.Config{ForwarderTopic: fwdIn})
		if err != nil {
			_ = sub.Close()
			return nil, err
		}
		meas := h.startMeasuring(string(r.kind) + "-" + Forwarder)
		runErr := make(chan error, 1)
		go func() { runErr <- f.Run(ctx) }()
		err = waitDone(ctx, cp.done, h.opts.variantTimeout, func() string {
			return fmt.Sprintf("forwarder forwarded %d of %d", cp.n.Load(), n)
		})
		meas.stop(&res)
		quiet.Store(true) // the SQL subscriber logs its cancelled query at shutdown
		_ = f.Close()
		h.drain("forwarder", runErr)
		quiet.Store(false)
		if err != nil {
			return nil, err
		}
		el := time.Duration(cp.last.Load() - cp.first.Load())
		res.Seconds, res.MsgsPerSec = el.Seconds(), float64(n)/el.Seconds()
		res.Notes = "watermill-sql subscriber batch 100, one message per Publish call"
		results = append(results, res)
	}
	if err := cleanSchema(ctx, h.db, h.opts.schema); err != nil {
		return results, err
	}
	return results, nil
}

func batch(from, to int) []*message.Message {
	msgs := make([]*message.Message, 0, to-from)
	for i := from; i < to; i++ {
		msgs = append(msgs, message.NewMessage(newUUID(), payload(i)))
	}
	return msgs
}

func newUUID() string { return watermill.NewUUID() }

// drain waits for a component's Run to return after Close, and logs the error it returned: a
// component that does not stop cleanly is worth knowing about even when its figures are good.
func (h *harness) drain(what string, runErr <-chan error) {
	if err := <-runErr; err != nil {
		h.logger.Error(what+" stopped with an error", err, nil)
	}
}

func waitDone(ctx context.Context, done <-chan struct{}, timeout time.Duration, progress func() string) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("timed out after %s: %s", timeout, progress())
	case <-ctx.Done():
		return fmt.Errorf("%w: %s", ctx.Err(), progress())
	}
}
