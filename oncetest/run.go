package oncetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
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

// ownTxShutdownGrace is once.Config.ShutdownGrace in the own-transaction mode (and the inbox
// Processor's): long enough for a handler cancelled by FaultShutdown to commit.
const ownTxShutdownGrace = 2 * time.Second

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
	endedTx     error         // the middleware found the handler had ended its transaction
	refused     map[int]error // event -> its permanent failure (parked by a real router)
	failed      error         // a copy still failing after maxRedeliveries, with its last error
	selfAck     string        // the deliveries whose handler acked or nacked its message
	handlerErr  error         // the last error the handler returned
	deliveryErr error         // the last error a delivery failed with that the kit did not inject
}

// outcome collects the deliveries' results of one run.
type outcome struct {
	mu          sync.Mutex
	endedTx     error
	refused     map[int]error
	failed      error
	selfAck     []string
	selfAcked   chan struct{} // closed at the first self-ack
	handlerErr  error
	deliveryErr error
}

// record keeps the result of a copy of event that did not succeed: a permanent failure, or
// (gaveUp) one still failing after maxRedeliveries.
func (o *outcome) record(event int, err error, gaveUp bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case errors.Is(err, wmonce.ErrHandlerEndedTx) || strings.Contains(fmt.Sprint(err), wmonce.ErrHandlerEndedTx.Error()):
		o.endedTx = cmpErr(o.endedTx, err)
	case gaveUp:
		o.failed = cmpErr(o.failed, err)
	default:
		if o.refused == nil {
			o.refused = map[int]error{}
		}
		o.refused[event] = cmpErr(o.refused[event], err)
	}
}

// sawHandlerError keeps the last error the user's handler returned: the cause a report shows.
func (o *outcome) sawHandlerError(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.handlerErr = err
}

// sawDeliveryError keeps the last error a delivery failed with, unless the kit caused it.
func (o *outcome) sawDeliveryError(err error) {
	if err == nil || injected(err) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.deliveryErr = err
}

func (o *outcome) sawSelfAck(what string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.selfAck) == 0 {
		close(o.selfAcked)
	}
	o.selfAck = append(o.selfAck, what)
}

func (o *outcome) result(res *runResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	res.endedTx, res.refused, res.failed = o.endedTx, o.refused, o.failed
	res.handlerErr, res.deliveryErr = o.handlerErr, o.deliveryErr
	if len(o.selfAck) > 0 {
		sort.Strings(o.selfAck)
		res.selfAck = strings.Join(o.selfAck, ", ")
	}
}

// injected says whether err is one the kit caused (a fault, a cancelled context).
func injected(err error) bool {
	return errors.Is(err, errInjected) || errors.Is(err, errKilled) || errors.Is(err, context.Canceled) ||
		strings.Contains(err.Error(), errInjected.Error()) || strings.Contains(err.Error(), errKilled.Error())
}

func cmpErr(old, err error) error {
	if old != nil {
		return old
	}
	return err
}

// eventOf returns the event index of a delivery id ("e<event>c<copy>"), -1 for another one.
func eventOf(delivery string) int {
	var e, c int
	if _, err := fmt.Sscanf(delivery, "e%dc%d", &e, &c); err != nil {
		return -1
	}
	return e - 1
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
	out := &outcome{selfAcked: make(chan struct{})}
	in := &injector{schema: k.cfg.Schema, fault: s.fault, out: out}
	copies, err := makeCopies(events, s, in)
	if err != nil {
		return res, err
	}
	published := k.publisher.n.Load()
	if err := k.runMode(ctx, h, mode, s, consumer, topic, in, copies, out); err != nil {
		return res, err
	}
	res.published = k.publisher.n.Load() - published
	out.result(&res)
	if err := k.observe(ctx, topic, &res); err != nil {
		return res, err
	}
	// Outputs expected: as many as the reference stores for these events. The reference is
	// the own-transaction run of the same events; its count is kept per set of events.
	res.wantOutputs = k.wantOutputs(s.order, mode, s, res.outputs)
	return res, nil
}

// makeCopies makes the deliveries of s: s.copies copies of each event of its order, each
// marked with its delivery id; the injector targets the first copy of s.target.
func makeCopies(events []*message.Message, s schedule, in *injector) ([]copyOf, error) {
	var copies []copyOf
	for _, e := range s.order {
		if e >= len(events) {
			return nil, fmt.Errorf("Events returned %d messages, fewer than before", len(events))
		}
		cs := copiesOf(e, events[e], s.copies)
		if e == s.target && len(cs) > 0 {
			in.target = cs[0].id // the fault hits the event's first copy
		}
		copies = append(copies, cs...)
	}
	return copies, nil
}

// copiesOf makes n copies of event e (msg), each marked with its delivery id.
func copiesOf(e int, msg *message.Message, n int) []copyOf {
	cs := make([]copyOf, n)
	for c := range cs {
		m := msg.Copy()
		id := fmt.Sprintf("e%dc%d", e+1, c+1)
		m.Metadata.Set(metadataDelivery, id)
		cs[c] = copyOf{event: e, id: id, msg: m}
	}
	return cs
}

// runMode delivers the copies in mode.
func (k *Kit) runMode(ctx context.Context, h message.HandlerFunc, mode Mode, s schedule, consumer, topic string, in *injector, copies []copyOf, out *outcome) error {
	switch mode {
	case ModeSubscriberTx:
		return k.runSubscriberTx(ctx, h, s, consumer, topic, in, copies, out)
	case ModeInbox:
		return k.runInbox(ctx, h, s, consumer, topic, in, copies, out)
	}
	return k.runMiddleware(ctx, h, mode, s, consumer, topic, in, copies, out)
}

// observe reads the run's effect and counts its outputs.
func (k *Kit) observe(ctx context.Context, topic string, res *runResult) error {
	var err error
	if res.effect, err = k.cfg.Effect(ctx, k.cfg.DB); err != nil {
		return fmt.Errorf("Effect: %w", err)
	}
	res.outputs, err = k.countOutputs(ctx, topic)
	return err
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
	// ShutdownGrace per mode, so FaultShutdown takes both paths of a closing router: in a
	// transaction of its own the cancelled handler goes on and commits within the grace (its
	// copy, delivered again, must be skipped); in a group the attempt is cancelled at once and
	// rolled back (the copy delivered again must apply). In watermill-sql's subscriber
	// transaction the grace has no effect: the subscriber's context ends the transaction.
	cfg.GroupCommit = once.GroupCommitConfig{Disabled: true} // one transaction per message
	cfg.ShutdownGrace = ownTxShutdownGrace
	if mode == ModeGroupCommit {
		cfg.GroupCommit = once.GroupCommitConfig{Workers: groupWorkers, TxBatchSize: 100}
		cfg.ShutdownGrace = -1
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
	b := &brokerRun{ctx: ctx, out: out}
	in.shutdown = b.shutdown
	chain, mw, err := k.chain(h, mode, consumer, topic, in)
	if err != nil {
		return err
	}
	defer func() { _ = mw.Close() }()
	b.chain = chain
	if !s.concurrent {
		b.deliverInTurn(copies, s.fault == FaultReorder)
		return nil
	}
	k.deliverAtOnce(b, mw, mode, s, in, copies)
	return nil
}

// brokerRun is the broker of runMiddleware: it delivers copies through chain and closes the
// router under a delivery for FaultShutdown.
type brokerRun struct {
	ctx     context.Context
	chain   message.HandlerFunc
	out     *outcome
	cancels sync.Map // delivery -> context.CancelFunc
	shut    sync.Map // deliveries the router was closed under
}

// shutdown closes the router under delivery: it cancels that delivery's context.
func (b *brokerRun) shutdown(delivery string) {
	b.shut.Store(delivery, true)
	if c, ok := b.cancels.Load(delivery); ok {
		c.(context.CancelFunc)()
	}
}

// deliverOnce delivers c one time and says whether the broker delivers it again: after a
// transient failure, or when the router closed before it acked.
func (b *brokerRun) deliverOnce(c copyOf) (again bool, err error) {
	dctx, cancel := context.WithCancel(b.ctx)
	b.cancels.Store(c.id, cancel)
	m := c.msg.Copy()
	m.SetContext(dctx)
	_, err = b.chain(m)
	cancel()
	if _, closed := b.shut.LoadAndDelete(c.id); closed {
		return true, err // the router closed before it acked: the broker delivers the copy again
	}
	if err == nil {
		return false, nil
	}
	b.out.sawDeliveryError(err)
	if wmonce.IsPermanent(err) || wmonce.IsPanic(err) {
		b.out.record(c.event, err, false)
		return false, err
	}
	return true, err
}

func (b *brokerRun) giveUp(c copyOf, last error) {
	b.out.record(c.event, fmt.Errorf("copy %s: still failing after %d deliveries; the last one failed with: %w", c.id, maxRedeliveries, last), true)
}

// deliver delivers c until it is acked, at most maxRedeliveries times.
func (b *brokerRun) deliver(c copyOf) {
	var last error
	for range maxRedeliveries {
		again, err := b.deliverOnce(c)
		if err != nil {
			last = err
		}
		if !again {
			return
		}
	}
	b.giveUp(c, last)
}

// deliverInTurn delivers copies one at a time. A copy that fails is delivered again at once (as
// Kafka does), except with requeue (FaultReorder): there it goes behind the others (as a broker
// requeues it), so an event refused until an earlier one arrives (a version gap) lets that one
// through.
func (b *brokerRun) deliverInTurn(copies []copyOf, requeue bool) {
	queue := pendingCopies(copies)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		again, err := b.deliverOnce(p.c)
		if err != nil {
			p.last = err
		}
		p.tries++
		switch {
		case !again:
		case p.tries >= maxRedeliveries:
			b.giveUp(p.c, p.last)
		default:
			queue = putBack(queue, p, requeue)
		}
	}
}

// pending is a copy waiting in deliverInTurn's queue, with its failed deliveries so far.
type pending struct {
	c     copyOf
	tries int
	last  error
}

func pendingCopies(copies []copyOf) []pending {
	queue := make([]pending, len(copies))
	for i, c := range copies {
		queue[i] = pending{c: c}
	}
	return queue
}

// putBack returns queue with the failed copy p behind the others (requeue) or first.
func putBack(queue []pending, p pending, requeue bool) []pending {
	if requeue {
		return append(queue, p)
	}
	return append([]pending{p}, queue...)
}

// deliverAtOnce delivers every copy, and under FaultFailingNeighbours the failing neighbours,
// at the same time; with group commit it holds the lanes until all of them wait in the queue,
// so they share one transaction.
func (k *Kit) deliverAtOnce(b *brokerRun, mw *once.Middleware, mode Mode, s schedule, in *injector, copies []copyOf) {
	var neighbours []copyOf
	if s.fault == FaultFailingNeighbours {
		neighbours = failingNeighbours()
	}
	var wg sync.WaitGroup
	var release func()
	if mode == ModeGroupCommit {
		release = k.holdLanes(&wg, b.chain, in)
	}
	all := append(append([]copyOf(nil), copies...), neighbours...)
	// Interleave the neighbours with the events, so a group runs them among each other.
	for _, c := range all {
		wg.Add(1)
		go func() { defer wg.Done(); b.deliver(c) }()
	}
	if release != nil {
		waitQueued(mw, len(all))
		release()
	}
	wg.Wait()
}

// failingNeighbours are three kit messages whose handler fails its first attempt.
func failingNeighbours() []copyOf {
	var neighbours []copyOf
	for i := range 3 {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(metadataRole, roleNeighbour)
		m.Metadata.Set(metadataDelivery, fmt.Sprintf("n%d", i+1))
		neighbours = append(neighbours, copyOf{event: -1, id: fmt.Sprintf("n%d", i+1), msg: m})
	}
	return neighbours
}

// holdLanes occupies every group-commit lane with a blocker until the returned release is
// called, so that the deliveries started meanwhile queue up and run as one group.
func (k *Kit) holdLanes(wg *sync.WaitGroup, chain message.HandlerFunc, in *injector) func() {
	in.blockersStarted = make(chan struct{}, groupWorkers)
	in.release = make(chan struct{})
	for i := range groupWorkers {
		m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		m.Metadata.Set(metadataRole, roleBlocker)
		m.Metadata.Set(metadataDelivery, fmt.Sprintf("b%d", i+1))
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
