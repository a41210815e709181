package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Publishing before anyone subscribed, on RabbitMQ.
//
// Kafka and SQL keep a topic's messages for consumer groups that have not subscribed yet.
// RabbitMQ routes a message to the queues bound at the moment it is published, and a group's
// queue is declared when the group first subscribes (or by Declare / Config.Subscriptions):
// before that, the topic exchange's alternate exchange puts the message in the unrouted queue.
// So when a group's queue has just been declared and bound, rerouteUnrouted publishes the
// unrouted queue's messages again to the exchange each was first published to. Those of this
// topic now reach its bound queues; those of a topic still without a queue go back to the
// unrouted queue (through that exchange's alternate exchange, keeping their exchange for the
// next time); those of a topic whose queue appeared meanwhile reach it too. Each message is
// acked in the unrouted queue only after RabbitMQ confirmed its new copy: a crash in between
// leaves both, and the consumer's dedupe absorbs the second.
//
// This is done once per Broker and subscription (at its declaration), not at every reconnect:
// it takes each message of the unrouted queue off and publishes it again, which costs in
// proportion to that queue (a pass that runs out of the declaration's time stops, and the
// rest waits for the next). A message published to a topic in the same instant as its first
// group's queue is bound can still reach the unrouted queue after the pass; it is moved by the
// next declaration of any subscription (the next process start).

// rerouteBatch is how many messages a pass takes off the unrouted queue before it waits for the
// confirms of their new copies.
const rerouteBatch = 64

// rerouteUnrouted publishes the messages waiting in the unrouted queue again to their own
// exchanges (see above). Each message is handled at most once per pass: the pass takes as
// many as the queue held when it began, and those that go back are appended behind them.
// Messages whose exchange no longer exists are left where they are.
func (b *Broker) rerouteUnrouted(ctx context.Context, conn *amqp.Connection) error {
	err := b.reroutePass(ctx, conn)
	if err != nil && ctx.Err() != nil {
		// Out of time (a long unrouted queue): what the pass did not reach waits for the
		// next one. Failing the declaration would only start the same pass again.
		b.logger.Error("Unrouted queue not fully processed in time; the rest waits for the next subscription's declaration", err,
			watermill.LogFields{"queue": b.config.AMQP.UnroutedQueueName()})
		return nil
	}
	return err
}

func (b *Broker) reroutePass(ctx context.Context, conn *amqp.Connection) error {
	a := b.config.AMQP
	if a.DisableUnroutedQueue {
		return nil
	}
	// Passes of one Broker (several subscriptions declared at once) run one after the other,
	// so that none holds messages another is looking for.
	b.rerouteMu.Lock()
	defer b.rerouteMu.Unlock()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("broker: open RabbitMQ channel: %w", err)
	}
	defer ch.Close()
	queue := a.UnroutedQueueName()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("broker: inspect queue %q: %w", queue, err)
	}
	if q.Messages == 0 {
		return nil
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("broker: enable publisher confirms: %w", err)
	}
	rr := rerouter{b: b, conn: conn, ch: ch, queue: queue,
		exists: map[string]bool{"": true, queue: true}} // the default exchange and the unrouted one
	for remaining := q.Messages; remaining > 0; {
		var batch []rerouteCopy
		if batch, remaining, err = rr.copyBatch(ctx, remaining); err != nil {
			return err
		}
		if err := rr.confirm(ctx, batch); err != nil {
			return err
		}
	}
	rerouted, left := rr.rerouted, rr.left
	b.logger.Info("Published the unrouted queue's messages again to their exchanges", watermill.LogFields{
		"queue": queue, "republished": rerouted, "exchange_gone": left,
	})
	return nil
}

// rerouter is one reroute pass over the unrouted queue on its channel ch.
type rerouter struct {
	b              *Broker
	conn           *amqp.Connection
	ch             *amqp.Channel
	queue          string
	exists         map[string]bool // exchanges by name: whether they exist
	rerouted, left int             // published again; left unacked, their exchange gone
}

// rerouteCopy is a message of the unrouted queue published again, awaiting its confirm.
type rerouteCopy struct {
	d       amqp.Delivery
	confirm *amqp.DeferredConfirmation
}

// copyBatch gets up to rerouteBatch of the remaining messages and publishes each again to its
// exchange; it returns them and how many remain (0 once the queue is empty).
func (rr *rerouter) copyBatch(ctx context.Context, remaining int) ([]rerouteCopy, int, error) {
	var batch []rerouteCopy
	for len(batch) < min(remaining, rerouteBatch) {
		d, ok, err := rr.ch.Get(rr.queue, false)
		if err != nil {
			return nil, remaining, fmt.Errorf("broker: get from queue %q: %w", rr.queue, err)
		}
		if !ok {
			return batch, 0, nil
		}
		remaining--
		if !rr.exchangeExists(d.Exchange) {
			rr.left++ // unacked: back in the queue when the channel closes
			continue
		}
		dc, err := rr.ch.PublishWithDeferredConfirmWithContext(ctx, d.Exchange, d.RoutingKey, false, false, rr.b.republishing(d))
		if err != nil {
			return nil, remaining, fmt.Errorf("broker: publish to RabbitMQ exchange %q: %w", d.Exchange, err)
		}
		batch = append(batch, rerouteCopy{d, dc})
	}
	return batch, remaining, nil
}

// exchangeExists looks an exchange up once a pass.
func (rr *rerouter) exchangeExists(name string) bool {
	known, checked := rr.exists[name]
	if !checked {
		known = exchangeExists(rr.conn, name)
		rr.exists[name] = known
	}
	return known
}

// confirm waits for the batch's confirms and acks each original once its copy is confirmed.
func (rr *rerouter) confirm(ctx context.Context, batch []rerouteCopy) error {
	for _, c := range batch {
		acked, err := c.confirm.WaitContext(ctx)
		if err != nil || !acked {
			return fmt.Errorf("broker: RabbitMQ did not confirm a message moved from queue %q (acked=%v): %w", rr.queue, acked, errors.Join(err, errors.New("not confirmed")))
		}
		if err := c.d.Ack(false); err != nil {
			return fmt.Errorf("broker: ack in queue %q: %w", rr.queue, err)
		}
		rr.rerouted++
	}
	return nil
}

// republishing is d as it was published. The user-id property is dropped when it names
// another user than this connection's: RabbitMQ refuses a publish whose user-id is not the
// publishing user (the original producer's was checked when it published).
func (b *Broker) republishing(d amqp.Delivery) amqp.Publishing {
	p := amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: d.DeliveryMode, Priority: d.Priority, CorrelationId: d.CorrelationId,
		ReplyTo: d.ReplyTo, Expiration: d.Expiration, MessageId: d.MessageId, Timestamp: d.Timestamp,
		Type: d.Type, UserId: d.UserId, AppId: d.AppId, Body: d.Body,
	}
	if p.UserId != "" {
		if u, err := amqp.ParseURI(b.config.AMQP.URL); err != nil || u.Username != p.UserId {
			p.UserId = ""
		}
	}
	return p
}

// exchangeExists asks on a channel of its own: RabbitMQ closes the channel of a passive
// declaration that finds nothing.
func exchangeExists(conn *amqp.Connection, name string) bool {
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer ch.Close()
	return ch.ExchangeDeclarePassive(name, "fanout", true, false, false, false, nil) == nil
}
