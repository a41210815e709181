package broker

import (
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
)

type amqpChannel = *amqp.Channel

// unroutedName is the alternate exchange and queue that keep messages published to a topic
// with no bound queue.
const unroutedName = "wmonce.unrouted"

// ExchangeName returns the RabbitMQ exchange of a topic: a durable fanout exchange.
func (c AMQPConfig) ExchangeName(topic string) string { return c.Prefix + topic }

// QueueName returns the durable queue of one consumer group on one topic. Groups cannot contain
// ':', so the name is unambiguous.
func (c AMQPConfig) QueueName(topic, group string) string { return c.Prefix + topic + ":" + group }

// UnroutedQueueName returns the queue that collects messages no queue was bound for.
func (c AMQPConfig) UnroutedQueueName() string { return c.Prefix + unroutedName }

// declareUnrouted declares the alternate exchange and its queue.
func (b *Broker) declareUnrouted(conn *amqp.Connection, ch *amqp.Channel) error {
	a := b.config.AMQP
	if a.DisableUnroutedQueue {
		return nil
	}
	name := a.UnroutedQueueName()
	if err := ch.ExchangeDeclare(name, "fanout", true, false, false, false, nil); err != nil {
		return fmt.Errorf("broker: declare exchange %q: %w", name, err)
	}
	if err := b.declareDurableQueue(conn, name); err != nil {
		return err
	}
	if err := ch.QueueBind(name, "", name, false, nil); err != nil {
		return fmt.Errorf("broker: bind queue %q: %w", name, err)
	}
	return nil
}

// declareExchange declares a topic's durable fanout exchange, with the unrouted exchange as its
// alternate: a message that no queue is bound for is kept there instead of being dropped.
func (b *Broker) declareExchange(conn *amqp.Connection, ch *amqp.Channel, topic string) error {
	if err := b.declareUnrouted(conn, ch); err != nil {
		return err
	}
	a := b.config.AMQP
	var args amqp.Table
	if !a.DisableUnroutedQueue {
		args = amqp.Table{"alternate-exchange": a.UnroutedQueueName()}
	}
	name := a.ExchangeName(topic)
	if err := ch.ExchangeDeclare(name, "fanout", true, false, false, false, args); err != nil {
		return fmt.Errorf("broker: declare exchange %q: %w", name, err)
	}
	return nil
}

// declareQueue declares a group's durable queue on a topic and binds it.
func (b *Broker) declareQueue(conn *amqp.Connection, ch *amqp.Channel, topic, group string) error {
	if err := b.declareExchange(conn, ch, topic); err != nil {
		return err
	}
	a := b.config.AMQP
	q := a.QueueName(topic, group)
	if err := b.declareDurableQueue(conn, q); err != nil {
		return err
	}
	if err := ch.QueueBind(q, "", a.ExchangeName(topic), false, nil); err != nil {
		return fmt.Errorf("broker: bind queue %q: %w", q, err)
	}
	return nil
}

func (b *Broker) queueArgs() amqp.Table {
	if b.config.AMQP.QueueType == queueTypeQuorum {
		return amqp.Table{"x-queue-type": queueTypeQuorum, argDeliveryLimit: int64(b.config.AMQP.DeliveryLimit)}
	}
	return nil
}

// argDeliveryLimit is the quorum-queue argument RabbitMQ drops or dead-letters a message by
// once it has been delivered that many times (AMQPConfig.DeliveryLimit).
const argDeliveryLimit = "x-delivery-limit"

// declareDurableQueue declares the durable queue name with queueArgs, on a channel of its own:
// a refused declare closes the channel it ran on. A queue that exists with another delivery
// limit (declared before this package set one, or by hand) is kept as it is, checked with a
// passive declare, and a warning says what that limit means.
func (b *Broker) declareDurableQueue(conn *amqp.Connection, name string) error {
	declare := func(passive bool) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("broker: open RabbitMQ channel: %w", err)
		}
		defer ch.Close()
		if passive {
			_, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
		} else {
			_, err = ch.QueueDeclare(name, true, false, false, false, b.queueArgs())
		}
		return err
	}
	err := declare(false)
	if err != nil && strings.Contains(err.Error(), "inequivalent arg '"+argDeliveryLimit+"'") {
		if _, warned := b.declared.LoadOrStore("delivery-limit:"+name, struct{}{}); !warned {
			b.logger.Error("RabbitMQ queue keeps the delivery limit it was declared with, not AMQP.DeliveryLimit: on RabbitMQ 4 a quorum queue without one drops a message delivered 20 times (a handler failing through a short outage gets there); "+
				"set a policy with a high delivery-limit for it, or delete the empty queue so that it is declared again", err, watermill.LogFields{"queue": name, "delivery_limit": b.config.AMQP.DeliveryLimit})
		}
		err = declare(true)
	}
	if err != nil {
		return fmt.Errorf("broker: declare queue %q: %w", name, err)
	}
	return nil
}

// withAMQPChannel runs fn on a channel of a short-lived connection of its own.
func (b *Broker) withAMQPChannel(fn func(conn *amqp.Connection, ch amqpChannel) error) error {
	return b.withAMQPConn(func(conn *amqp.Connection) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("broker: open RabbitMQ channel: %w", err)
		}
		defer ch.Close()
		return fn(conn, ch)
	})
}

// withAMQPConn runs fn on a short-lived connection of its own.
func (b *Broker) withAMQPConn(fn func(conn *amqp.Connection) error) error {
	c := b.newAMQPConn("admin")
	conn, err := amqp.DialConfig(c.url, c.config)
	if err != nil {
		return fmt.Errorf("broker: cannot reach RabbitMQ at %s (is it running? set %s): %w", redactURL(c.url), EnvAMQPURL, err)
	}
	defer conn.Close()
	return fn(conn)
}

// DeleteAMQPTopology deletes the queues of subs and the exchanges of their topics (for tests
// and demos that declare throw-away names). It leaves the unrouted queue alone: it is shared by
// every topic under the prefix and may hold messages of others.
func (b *Broker) DeleteAMQPTopology(subs ...Subscription) error {
	a := b.config.AMQP
	return b.withAMQPChannel(func(_ *amqp.Connection, ch amqpChannel) error {
		topics := map[string]bool{}
		for _, s := range subs {
			if _, err := ch.QueueDelete(a.QueueName(s.Topic, s.Group), false, false, false); err != nil {
				return err
			}
			topics[s.Topic] = true
		}
		for t := range topics {
			if err := ch.ExchangeDelete(a.ExchangeName(t), false, false); err != nil {
				return err
			}
		}
		return nil
	})
}
