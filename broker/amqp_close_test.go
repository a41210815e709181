package broker_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// signalLogger reports, once, the first error log whose message contains substr.
type signalLogger struct {
	watermill.NopLogger
	substr string
	once   sync.Once
	seen   chan struct{}
}

func (l *signalLogger) Error(msg string, err error, fields watermill.LogFields) {
	if strings.Contains(msg, l.substr) {
		l.once.Do(func() { close(l.seen) })
	}
}

func (l *signalLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// TestAMQPSubscriberCloseWhileRabbitMQIsUnreachable closes a subscriber while it is redialling
// a RabbitMQ that refuses it. Close used to wait for the redial loop, which only stopped when
// the Subscribe context ended: a program shutting down during a RabbitMQ outage hung.
func TestAMQPSubscriberCloseWhileRabbitMQIsUnreachable(t *testing.T) {
	t.Parallel()
	topic := pgtest.NewName("outage")
	cfg := brokertest.Config(t, broker.AMQP, "")
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "g"}}
	logger := &signalLogger{substr: "Cannot connect to RabbitMQ", seen: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.New(ctx, nil, cfg, logger)
	require.NoError(t, err)
	defer b.Close()
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	sub, err := b.NewSubscriber("g")
	require.NoError(t, err)
	msgs, err := sub.Subscribe(context.Background(), topic) // a context that never ends
	require.NoError(t, err)
	require.NoError(t, pub.Publish(topic, message.NewMessage("m-1", []byte("x"))))
	receiveOne(t, msgs).Ack() // consuming

	// The outage: the user may no longer use the vhost, and every connection is closed.
	vhost := brokertest.Vhost(cfg.AMQP.URL)
	brokertest.Rabbitmqctl(t, "clear_permissions", "-p", vhost, "guest")
	brokertest.Rabbitmqctl(t, "close_all_connections", "-p", vhost, "watermill-once test: outage")
	select {
	case <-logger.seen:
	case <-ctx.Done():
		t.Fatal("the subscriber never tried to reconnect")
	}

	closed := make(chan error, 1)
	go func() { closed <- sub.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10s while RabbitMQ refused connections")
	}
	_, open := <-msgs
	require.False(t, open)
}
