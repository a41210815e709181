package broker

import (
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
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

func (b *Broker) amqpConnectionConfig() wamqp.ConnectionConfig {
	a := b.config.AMQP
	return wamqp.ConnectionConfig{
		AmqpURI: a.URL,
		AmqpConfig: &amqp.Config{
			Heartbeat:  10 * time.Second,
			Locale:     "en_US",
			Properties: amqp.Table{"connection_name": a.ConnectionName},
		},
		Reconnect: &wamqp.ReconnectConfig{
			BackoffInitialInterval:     200 * time.Millisecond,
			BackoffRandomizationFactor: 0.5,
			BackoffMultiplier:          1.5,
			BackoffMaxInterval:         5 * time.Second,
		},
	}
}

// amqpConfig is Watermill's durable pub/sub shape (a fanout exchange per topic, a durable
// queue per consumer group bound to it, persistent messages) with publisher confirms on, the
// topology declared by amqpTopology, and a marshaler that accepts any header type.
func (b *Broker) amqpConfig(group string) wamqp.Config {
	a := b.config.AMQP
	return wamqp.Config{
		Connection: b.amqpConnectionConfig(),
		Marshaler:  Marshaler{},
		Exchange: wamqp.ExchangeConfig{
			GenerateName: a.ExchangeName,
			Type:         "fanout",
			Durable:      true,
		},
		Queue: wamqp.QueueConfig{
			GenerateName: func(topic string) string { return a.QueueName(topic, group) },
			Durable:      true,
		},
		QueueBind: wamqp.QueueBindConfig{GenerateRoutingKey: func(string) string { return "" }},
		Publish: wamqp.PublishConfig{
			GenerateRoutingKey: func(string) string { return "" },
			// Publish returns only after RabbitMQ confirmed it has taken responsibility for the
			// message (for a quorum queue: written to a majority of replicas).
			ConfirmDelivery: true,
		},
		Consume: wamqp.ConsumeConfig{
			Qos: wamqp.QosConfig{PrefetchCount: a.Prefetch},
		},
		TopologyBuilder: amqpTopology{b: b},
	}
}

func (b *Broker) newAMQPPublisher() (message.Publisher, error) {
	return wamqp.NewPublisher(b.amqpConfig(""), b.logger)
}

func (b *Broker) newAMQPSubscriber(group string) (message.Subscriber, error) {
	return wamqp.NewSubscriber(b.amqpConfig(group), b.logger)
}

// amqpTopology declares exchanges and queues for Watermill's publisher and subscriber. The
// publisher calls ExchangeDeclare before its first message to a topic; we also declare the
// queues of Config.Subscriptions for that topic there, so a message is never published to an
// exchange before the queues that must receive it exist.
type amqpTopology struct{ b *Broker }

func (t amqpTopology) ExchangeDeclare(ch *amqp.Channel, exchangeName string, _ wamqp.Config) error {
	topic := strings.TrimPrefix(exchangeName, t.b.config.AMQP.Prefix)
	if err := t.b.declareExchange(ch, topic); err != nil {
		return err
	}
	for _, s := range t.b.config.Subscriptions {
		if s.Topic == topic {
			if err := t.b.declareQueue(ch, s.Topic, s.Group); err != nil {
				return err
			}
		}
	}
	return nil
}

// BuildTopology is called by the subscriber before it consumes: it declares the group's queue
// (named by AMQPConfig.QueueName) and binds it to the topic's exchange.
func (t amqpTopology) BuildTopology(ch *amqp.Channel, queueName, exchangeName string, _ wamqp.Config, _ watermill.LoggerAdapter) error {
	a := t.b.config.AMQP
	rest := strings.TrimPrefix(queueName, a.Prefix)
	i := strings.LastIndexByte(rest, ':')
	if i < 0 || a.ExchangeName(rest[:i]) != exchangeName {
		return fmt.Errorf("broker: queue %q does not follow the <prefix><topic>:<group> naming of exchange %q", queueName, exchangeName)
	}
	return t.b.declareQueue(ch, rest[:i], rest[i+1:])
}

// declareUnrouted declares the alternate exchange and its queue.
func (b *Broker) declareUnrouted(ch *amqp.Channel) error {
	a := b.config.AMQP
	if a.DisableUnroutedQueue {
		return nil
	}
	name := a.UnroutedQueueName()
	if err := ch.ExchangeDeclare(name, "fanout", true, false, false, false, nil); err != nil {
		return fmt.Errorf("broker: declare exchange %q: %w", name, err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, b.queueArgs()); err != nil {
		return fmt.Errorf("broker: declare queue %q: %w", name, err)
	}
	if err := ch.QueueBind(name, "", name, false, nil); err != nil {
		return fmt.Errorf("broker: bind queue %q: %w", name, err)
	}
	return nil
}

// declareExchange declares a topic's durable fanout exchange, with the unrouted exchange as its
// alternate: a message that no queue is bound for is kept there instead of being dropped.
func (b *Broker) declareExchange(ch *amqp.Channel, topic string) error {
	if err := b.declareUnrouted(ch); err != nil {
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
func (b *Broker) declareQueue(ch *amqp.Channel, topic, group string) error {
	if err := b.declareExchange(ch, topic); err != nil {
		return err
	}
	a := b.config.AMQP
	q := a.QueueName(topic, group)
	if _, err := ch.QueueDeclare(q, true, false, false, false, b.queueArgs()); err != nil {
		return fmt.Errorf("broker: declare queue %q: %w", q, err)
	}
	if err := ch.QueueBind(q, "", a.ExchangeName(topic), false, nil); err != nil {
		return fmt.Errorf("broker: bind queue %q: %w", q, err)
	}
	return nil
}

func (b *Broker) queueArgs() amqp.Table {
	if b.config.AMQP.QueueType == QueueTypeQuorum {
		return amqp.Table{"x-queue-type": QueueTypeQuorum}
	}
	return nil
}

// withAMQPChannel runs fn on a channel of a short-lived connection of its own.
func (b *Broker) withAMQPChannel(fn func(ch amqpChannel) error) error {
	cc := b.amqpConnectionConfig()
	conn, err := amqp.DialConfig(cc.AmqpURI, *cc.AmqpConfig)
	if err != nil {
		return fmt.Errorf("broker: cannot reach RabbitMQ at %s (is it running? set %s): %w", redactURL(cc.AmqpURI), EnvAMQPURL, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("broker: open RabbitMQ channel: %w", err)
	}
	defer ch.Close()
	return fn(ch)
}

// DeleteAMQPTopology deletes the queues of subs, the exchanges of their topics and the unrouted
// queue (for tests and demos that declare throw-away names).
func (b *Broker) DeleteAMQPTopology(subs ...Subscription) error {
	a := b.config.AMQP
	return b.withAMQPChannel(func(ch amqpChannel) error {
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
