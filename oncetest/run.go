package oncetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/kithook"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// maxRedeliveries bounds how often the kit redelivers a copy that failed, as a broker would
// (forever): a handler still failing then is reported.
const maxRedeliveries = 20

// groupWorkers is the group-commit lanes of the kit's middleware: the kit holds them all with
// blockers to make the events of a schedule queue up and share one transaction.
const groupWorkers = 2

// runResult is what one run showed.
type runResult struct {
	events      []*message.Message
	effect      any
	outputs     int // output messages stored in the outbox for this run
	wantOutputs int
	published   int64
	endedTx     error // the middleware found the handler had ended its transaction
	refused     error // a permanent failure (parked by a real router)
	failed      error // still failing after maxRedeliveries
}

// outcome collects the deliveries' results of one run.
type outcome struct {
	mu      sync.Mutex
	endedTx error
	refused error
	failed  error
}

func (o *outcome) record(err error, gaveUp bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case errors.Is(err, wmonce.ErrHandlerEndedTx) || strings.Contains(fmt.Sprint(err), wmonce.ErrHandlerEndedTx.Error()):
		o.endedTx = cmpErr(o.endedTx, err)
	case gaveUp:
		o.failed = cmpErr(o.failed, err)
	default:
		o.refused = cmpErr(o.refused, err)
	}
}

func cmpErr(old, err error) error {
	if old != nil {
		return old
	}
	return err
}

// copyOf is one delivered copy of an event.
type copyOf struct {
	event int
	id    string
	msg   *message.Message
}

// run resets the handler's state and delivers s in mode under a consumer name of its own.
func (k *Kit) run(ctx context.Context, h message.HandlerFunc, mode Mode, s schedule) (runResult, error) {
	events := k.cfg.Events()
	res := runResult{events: events}
	if err := k.cfg.Reset(ctx, k.cfg.DB); err != nil {
		return res, fmt.Errorf("Reset: %w", err)
	}
	consumer := fmt.Sprintf("oncetest_%s_%d", randomHex(), k.runs.Add(1))
	topic := consumer // the outputs' topic: this run's outbox rows
	in := &injector{schema: k.cfg.Schema, fault: s.fault}
	var copies []copyOf
	for _, e := range s.order {
		if e >= len(events) {
			return res, fmt.Errorf("Events returned %d messages, fewer than before", len(events))
		}
		for c := range s.copies {
			m := events[e].Copy()
			id := fmt.Sprintf("e%dc%d", e+1, c+1)
			m.Metadata.Set(MetadataDelivery, id)
			copies = append(copies, copyOf{event: e, id: id, msg: m})
			if e == s.target && c == 0 {
				in.target = id
			}
		}
	}
	published := k.publisher.n.Load()
	out := &outcome{}
	var err error
	switch mode {
	case ModeOwnTx, ModeGroupCommit:
		err = k.runMiddleware(ctx, h, mode, s, consumer, topic, in, copies, out)
	case ModeSubscriberTx:
		err = k.runSubscriberTx(ctx, h, s, consumer, topic, in, copies, out)
	case ModeInbox:
		err = k.runInbox(ctx, h, s, consumer, topic, in, copies, out)
	}
	if err != nil {
		return res, err
	}
	res.published = k.publisher.n.Load() - published
	res.endedTx, res.refused, res.failed = out.endedTx, out.refused, out.failed
	if res.effect, err = k.cfg.Effect(ctx, k.cfg.DB); err != nil {
		return res, fmt.Errorf("Effect: %w", err)
	}
	if res.outputs, err = k.countOutputs(ctx, topic); err != nil {
		return res, err
	}
	// Outputs expected: as many as the reference stores for these events. The reference is
	// the own-transaction run of the same events; its count is kept per set of events.
	res.wantOutputs = k.wantOutputs(s.order, mode, s, res.outputs)
	return res, nil
}

func randomHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (k *Kit) countOutputs(ctx context.Context, topic string) (int, error) {
	var n int
	err := k.cfg.DB.QueryRowContext(ctx, `SELECT count(*) FROM `+pgtx.QualifiedName(k.cfg.Schema, "outbox")+
		` WHERE payload->>'destination_topic' = $1`, topic).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count the run's outputs in the outbox: %w", err)
	}
	return n, nil
}

// wantOutputs remembers the outputs of each reference run (FaultNone in ModeOwnTx) by its
// events and returns the remembered count for a run of the same events.
func (k *Kit) wantOutputs(order []int, mode Mode, s schedule, got int) int {
	key := fmt.Sprint(sortedCopy(order))
	k.outputsMu.Lock()
	defer k.outputsMu.Unlock()
	if k.outputs == nil {
		k.outputs = map[string]int{}
	}
	if s.fault == FaultNone && mode == ModeOwnTx {
		k.outputs[key] = got
	}
	if want, ok := k.outputs[key]; ok {
		return want
	}
	return got
}

func sortedCopy(xs []int) []int {
	c := append([]int(nil), xs...)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if c[j] < c[i] {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c
}

func (k *Kit) middlewareConfig(mode Mode, consumer, topic string) once.Config {
	var cfg once.Config
	if k.cfg.Middleware != nil {
		k.cfg.Middleware(&cfg)
	}
	cfg.Schema, cfg.Consumer, cfg.OutputTopic = k.cfg.Schema, consumer, topic
	cfg.Outbox, cfg.OutboxSource = nil, ""
	cfg.GroupCommit = once.GroupCommitConfig{Disabled: true} // one transaction per message
	if mode == ModeGroupCommit {
		cfg.GroupCommit = once.GroupCommitConfig{Workers: groupWorkers, TxBatchSize: 100}
	}
	return cfg
}

// chain builds what a router runs: the Stack (Retry outside the transaction, parking off so
// the kit sees permanent errors) around once.Middleware around the injector around h.
func (k *Kit) chain(h message.HandlerFunc, mode Mode, consumer, topic string, in *injector) (message.HandlerFunc, *once.Middleware, error) {
	mw, err := once.New(k.cfg.DB, k.middlewareConfig(mode, consumer, topic), watermill.NopLogger{})
	if err != nil {
		return nil, nil, fmt.Errorf("once.New with the configured Middleware: %w", err)
	}
	stack, err := once.Stack(once.StackConfig{
		Middleware:     mw,
		DisableParking: true,
		Retry:          wmiddleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond},
	})
	if err != nil {
		return nil, nil, err
	}
	chained := in.wrap(h)
	for i := len(stack) - 1; i >= 0; i-- {
		chained = stack[i](chained)
	}
	return chained, mw, nil
}

// runMiddleware delivers copies as Kafka or RabbitMQ would: each until it is acked, a failed
// copy again (a new copy, a new context).
func (k *Kit) runMiddleware(ctx context.Context, h message.HandlerFunc, mode Mode, s schedule, consumer, topic string, in *injector, copies []copyOf, out *outcome) error {
	cancels := sync.Map{} // delivery -> context.CancelFunc
	shut := sync.Map{}    // deliveries the router was closed under
	in.shutdown = func(delivery string) {
		shut.Store(delivery, true)
		if c, ok := cancels.Load(delivery); ok {
			c.(context.CancelFunc)()
		}
	}
	chain, mw, err := k.chain(h, mode, consumer, topic, in)
	if err != nil {
		return err
	}
	defer func() { _ = mw.Close() }()

	deliver := func(c copyOf) {
		for range maxRedeliveries {
			dctx, cancel := context.WithCancel(ctx)
			cancels.Store(c.id, cancel)
			m := c.msg.Copy()
			m.SetContext(dctx)
			_, err := chain(m)
			cancel()
			if _, closed := shut.LoadAndDelete(c.id); closed {
				continue // the router closed before it acked: the broker delivers the copy again
			}
			if err == nil {
				return
			}
			if wmonce.IsPermanent(err) || wmonce.IsPanic(err) {
				out.record(err, false)
				return
			}
		}
		out.record(fmt.Errorf("copy %s: still failing", c.id), true)
	}

	if !s.concurrent {
		for _, c := range copies {
			deliver(c)
		}
		return nil
	}
	var neighbours []copyOf
	if s.fault == FaultFailingNeighbours {
		for i := range 3 {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			m.Metadata.Set(metadataRole, roleNeighbour)
			m.Metadata.Set(MetadataDelivery, fmt.Sprintf("n%d", i+1))
			neighbours = append(neighbours, copyOf{event: -1, id: fmt.Sprintf("n%d", i+1), msg: m})
		}
	}
	var wg sync.WaitGroup
	var release func()
	if mode == ModeGroupCommit {
		release = k.holdLanes(&wg, chain, in)
	}
	all := append(append([]copyOf(nil), copies...), neighbours...)
	// Interleave the neighbours with the events, so a group runs them among each other.
	for _, c := range all {
		wg.Add(1)
		go func() { defer wg.Done(); deliver(c) }()
	}
	if release != nil {
		waitQueued(mw, len(all))
		release()
	}
	wg.Wait()
	return nil
}

// holdLanes occupies every group-commit lane with a blocker until the returned release is
// called, so that the deliveries started meanwhile queue up and run as one group.
func (k *Kit) holdLanes(wg *sync.WaitGroup, chain message.HandlerFunc, in *injector) func() {
	in.blockersStarted = make(chan struct{}, groupWorkers)
	in.release = make(chan struct{})
	for i := range groupWorkers {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(metadataRole, roleBlocker)
		m.Metadata.Set(MetadataDelivery, fmt.Sprintf("b%d", i+1))
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = chain(m) }()
	}
	for range groupWorkers {
		<-in.blockersStarted
	}
	return func() { close(in.release) }
}

// waitQueued waits until n deliveries wait in mw's group-commit queue (internal/kithook reads
// it). It gives up after a while (a delivery may have failed before queueing): the run then
// groups fewer messages, and a violation it shows is still real.
func waitQueued(mw *once.Middleware, n int) {
	deadline := time.Now().Add(10 * time.Second)
	for kithook.GroupCommitQueued(mw) < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}
