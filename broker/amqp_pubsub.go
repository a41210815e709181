package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/wmonce/watermill-once/internal/worker"
)

// reconnectBackoff is the wait before a broker connection is tried again after it failed.
var reconnectBackoff = worker.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}

// The RabbitMQ publisher and subscriber are our own, on amqp091-go, speaking the wire format of
// watermill-amqp (Marshaler). watermill-amqp v2 and v3 race on reconnect: its ConnectionWrapper
// replaces the `connected` channel from the goroutine that watches for a closed connection while
// other goroutines read it without a lock (reported upstream as ThreeDotsLabs/watermill#693), so
// every lost connection is a data race, and a consumer built with -race dies on
// `rabbitmqctl close_all_connections`. Here each publisher and subscriber owns one connection,
// redialled on demand under a mutex. Owning the consume loop also lets a nack wait
// (NackDelay) before RabbitMQ requeues, instead of the immediate hot loop.

var errAMQPClosed = errors.New("broker: RabbitMQ publisher or subscriber is closed")

// amqpConn is one connection, dialled lazily and again whenever it was closed.
type amqpConn struct {
	url    string
	config amqp.Config
	logger watermill.LoggerAdapter

	mu     sync.Mutex
	conn   *amqp.Connection
	closed bool
}

func (b *Broker) newAMQPConn(role string) *amqpConn {
	a := b.config.AMQP
	return &amqpConn{
		url: a.URL,
		config: amqp.Config{
			Heartbeat:  10 * time.Second,
			Locale:     "en_US",
			Properties: amqp.Table{"connection_name": a.ConnectionName + " " + role},
		},
		logger: b.logger,
	}
}

// get returns a live connection, dialling (with backoff) until one is up or ctx ends.
func (c *amqpConn) get(ctx context.Context) (*amqp.Connection, error) {
	backoff := reconnectBackoff
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, errAMQPClosed
		}
		if c.conn != nil && !c.conn.IsClosed() {
			conn := c.conn
			c.mu.Unlock()
			return conn, nil
		}
		conn, err := amqp.DialConfig(c.url, c.config)
		if err == nil {
			c.conn = conn
			c.mu.Unlock()
			return conn, nil
		}
		c.mu.Unlock()
		wait := backoff.Next()
		c.logger.Error("Cannot connect to RabbitMQ, retrying", err, watermill.LogFields{"url": redactURL(c.url), "backoff": wait})
		if !worker.Sleep(ctx, wait) {
			return nil, fmt.Errorf("broker: connect to RabbitMQ at %s: %w", redactURL(c.url), errors.Join(err, ctx.Err()))
		}
	}
}

func (c *amqpConn) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.conn != nil && !c.conn.IsClosed() {
		return c.conn.Close()
	}
	return nil
}

// amqpPublisher publishes with publisher confirms on one channel, reopened after any failure.
// Publish returns nil only once RabbitMQ has confirmed (acked) every message of the call; it
// is safe for concurrent use, and concurrent calls wait for their confirms together.
type amqpPublisher struct {
	b         *Broker
	conn      *amqpConn
	marshaler Marshaler
	timeout   time.Duration

	mu sync.Mutex
	ch *amqp.Channel
}

func (b *Broker) newAMQPPublisher() (message.Publisher, error) {
	return &amqpPublisher{b: b, conn: b.newAMQPConn("publisher"), timeout: 30 * time.Second}, nil
}

func (p *amqpPublisher) Publish(topic string, msgs ...*message.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	pubs, err := p.marshalAll(msgs)
	if err != nil {
		return err
	}
	ch, confirms, err := p.send(ctx, topic, msgs, pubs)
	if err != nil {
		return err
	}
	return p.awaitConfirms(ctx, ch, msgs, confirms)
}

// marshalAll marshals msgs into AMQP publishings.
func (p *amqpPublisher) marshalAll(msgs []*message.Message) ([]amqp.Publishing, error) {
	pubs := make([]amqp.Publishing, len(msgs))
	for i, msg := range msgs {
		pub, err := p.marshaler.Marshal(msg)
		if err != nil {
			return nil, fmt.Errorf("broker: marshal message %s: %w", msg.UUID, err)
		}
		pubs[i] = pub
	}
	return pubs, nil
}

// send publishes pubs to the topic's exchange and returns their confirmations, to wait for
// outside the lock: the lock covers only the publishing frames, so concurrent Publish calls
// share the channel and wait for their confirms at the same time (RabbitMQ confirms them in
// batches) instead of one confirm round trip after the other.
func (p *amqpPublisher) send(ctx context.Context, topic string, msgs []*message.Message, pubs []amqp.Publishing) (*amqp.Channel, []*amqp.DeferredConfirmation, error) {
	exchange := p.b.config.AMQP.ExchangeName(topic)
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, err := p.channel(ctx)
	if err != nil {
		return nil, nil, err
	}
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for i, pub := range pubs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "", false, false, pub)
		if err != nil {
			p.dropChannel(ch)
			return nil, nil, fmt.Errorf("broker: publish message %s to RabbitMQ exchange %q: %w", msgs[i].UUID, exchange, err)
		}
		confirms = append(confirms, dc)
	}
	return ch, confirms, nil
}

// awaitConfirms waits until RabbitMQ confirmed every message; a message it did not confirm
// drops the channel (the next Publish opens another).
func (p *amqpPublisher) awaitConfirms(ctx context.Context, ch *amqp.Channel, msgs []*message.Message, confirms []*amqp.DeferredConfirmation) error {
	for i, dc := range confirms {
		acked, err := dc.WaitContext(ctx)
		if err != nil || !acked {
			p.mu.Lock()
			p.dropChannel(ch)
			p.mu.Unlock()
			return fmt.Errorf("broker: RabbitMQ did not confirm message %s (acked=%v): %w", msgs[i].UUID, acked, errors.Join(err, errors.New("not confirmed")))
		}
	}
	return nil
}

func (p *amqpPublisher) channel(ctx context.Context) (*amqp.Channel, error) {
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	conn, err := p.conn.get(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("broker: open RabbitMQ channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("broker: enable publisher confirms: %w", err)
	}
	p.ch = ch
	return ch, nil
}

// dropChannel closes ch if it is still the publisher's channel (another Publish may have
// replaced it already). Publish calls still waiting for confirms on it fail: unconfirmed.
func (p *amqpPublisher) dropChannel(ch *amqp.Channel) {
	if ch != nil && p.ch == ch {
		_ = p.ch.Close()
		p.ch = nil
	}
}

func (p *amqpPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropChannel(p.ch)
	return p.conn.close()
}

// amqpSubscriber consumes a group's queue: AMQPConfig.Workers messages in flight per
// subscription (one consumer, that many goroutines handing deliveries to the subscription's
// channel), each acked after the handler acks it, requeued NackDelay after a nack. A lost
// channel or connection is re-established with backoff; deliveries unacked at that moment are
// redelivered by RabbitMQ.
type amqpSubscriber struct {
	b         *Broker
	group     string
	conn      *amqpConn
	marshaler Marshaler
	logger    watermill.LoggerAdapter

	// mu orders Subscribe's running.Add against Close: a consumer is either counted before
	// Close starts waiting, or refused.
	mu        sync.Mutex
	closing   chan struct{}
	closeOnce sync.Once
	running   sync.WaitGroup
}

func (b *Broker) newAMQPSubscriber(group string) (message.Subscriber, error) {
	return &amqpSubscriber{
		b: b, group: group, conn: b.newAMQPConn("subscriber " + group),
		logger: b.logger.With(watermill.LogFields{"consumer_group": group}), closing: make(chan struct{}),
	}, nil
}

func (s *amqpSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	select {
	case <-s.closing:
		s.mu.Unlock()
		return nil, errAMQPClosed
	default:
	}
	s.running.Add(1)
	s.mu.Unlock()
	out := make(chan *message.Message)
	// Close cancels the consumer's context too: redialling an unreachable RabbitMQ waits on the
	// context, and Close waits for the consumer.
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	go func() {
		defer s.running.Done()
		defer close(out)
		defer cancel()
		s.consume(ctx, topic, out)
	}()
	return out, nil
}

func (s *amqpSubscriber) stopped(ctx context.Context) bool { return ended(ctx, s.closing) }

// ended reports whether a subscription is over: its subscriber is closing or its context ended.
func ended(ctx context.Context, closing <-chan struct{}) bool {
	select {
	case <-closing:
		return true
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

func (s *amqpSubscriber) consume(ctx context.Context, topic string, out chan<- *message.Message) {
	queue := s.b.config.AMQP.QueueName(topic, s.group)
	fields := watermill.LogFields{"topic": topic, "queue": queue}
	backoff := reconnectBackoff
	for !s.stopped(ctx) {
		consumed, err := s.consumeOnce(ctx, topic, queue, out)
		if s.stopped(ctx) {
			return
		}
		if consumed {
			backoff.Reset()
		}
		wait := backoff.Next()
		s.logger.Error("RabbitMQ consumer stopped, reconnecting", err, fields.Add(watermill.LogFields{"backoff": wait}))
		s.sleep(ctx, wait)
	}
}

// consumeOnce runs one channel until it fails; consumed reports whether it delivered anything.
func (s *amqpSubscriber) consumeOnce(ctx context.Context, topic, queue string, out chan<- *message.Message) (consumed bool, err error) {
	conn, err := s.conn.get(ctx)
	if err != nil {
		return false, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	if err := ch.Qos(s.b.config.AMQP.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("set prefetch: %w", err)
	}
	// Declared again on every (re)connection, in case the broker lost it.
	if err := s.b.declareQueue(conn, ch, topic, s.group); err != nil {
		return false, err
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("consume %q: %w", queue, err)
	}
	s.logger.Info("Consuming from RabbitMQ", watermill.LogFields{"queue": queue})
	// Workers goroutines, each with one message in flight. The first failure (a lost
	// channel: acks and nacks no longer reach RabbitMQ) stops them all; RabbitMQ redelivers
	// whatever was unacked on the channel.
	workCtx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		wg        sync.WaitGroup
		failOnce  sync.Once
		failed    error
		delivered atomic.Bool
	)
	fail := func(err error) {
		failOnce.Do(func() { failed = err })
		stop()
	}
	for range s.b.config.AMQP.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case d, ok := <-deliveries:
					if !ok {
						fail(errors.New("delivery channel closed (channel or connection lost)"))
						return
					}
					delivered.Store(true)
					if err := s.deliver(workCtx, d, out); err != nil {
						fail(err)
						return
					}
				case <-s.closing:
					stop()
					return
				case <-workCtx.Done():
					return
				}
			}
		}()
	}
	wg.Wait()
	return delivered.Load(), failed
}

// deliver hands one delivery to the consumer and settles it with RabbitMQ.
func (s *amqpSubscriber) deliver(ctx context.Context, d amqp.Delivery, out chan<- *message.Message) error {
	msg, err := s.marshaler.Unmarshal(d)
	if err != nil {
		return fmt.Errorf("unmarshal: %w", err) // Marshaler never fails; kept for safety
	}
	msgCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	msg.SetContext(msgCtx)
	if !s.send(ctx, out, msg) {
		return requeue(d)
	}
	return s.settle(ctx, d, msg)
}

// requeue hands d back to RabbitMQ, which delivers it again.
func requeue(d amqp.Delivery) error { return d.Nack(false, true) }

// send hands msg to the consumer; false when the subscriber closes or ctx ends first.
func (s *amqpSubscriber) send(ctx context.Context, out chan<- *message.Message, msg *message.Message) bool {
	select {
	case out <- msg:
		return true
	case <-s.closing:
	case <-ctx.Done():
	}
	return false
}

// settle acks d when the consumer acked msg, and requeues it when the consumer nacked it (after
// NackDelay: RabbitMQ requeues at once, so waiting keeps a failing message from spinning) or
// the subscriber closes first.
func (s *amqpSubscriber) settle(ctx context.Context, d amqp.Delivery, msg *message.Message) error {
	select {
	case <-msg.Acked():
		if err := d.Ack(false); err != nil {
			return fmt.Errorf("ack %s (it will be redelivered): %w", msg.UUID, err)
		}
		return nil
	case <-msg.Nacked():
		s.sleep(ctx, s.b.config.AMQP.NackDelay)
	case <-s.closing:
	case <-ctx.Done():
	}
	return requeue(d)
}

// sleep waits d, or until the subscriber closes or ctx ends.
func (s *amqpSubscriber) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.closing:
	case <-ctx.Done():
	}
}

func (s *amqpSubscriber) Close() error {
	s.mu.Lock()
	s.closeOnce.Do(func() { close(s.closing) })
	s.mu.Unlock()
	s.running.Wait()
	return s.conn.close()
}
