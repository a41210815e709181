package broker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
)

// Only refusals that publishing again cannot fix are permanent; a missing topic, a leaderless
// partition, an authorization failure and connection errors are not.
func TestIsPermanentPublishError(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("broker: Kafka publish to t: %w", err) }
	for _, err := range []error{
		wmonce.Permanent(errors.New("x")),
		wrap(sarama.ErrInvalidTopic), wrap(sarama.ErrMessageSizeTooLarge), wrap(sarama.ErrInvalidRecord),
		wrap(sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 2 > 1")),
		fmt.Errorf("x: %w", wsql.ErrInvalidTopicName),
		&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 200 is larger than configured max size 100"},
	} {
		require.True(t, broker.IsPermanentPublishError(err), "%v", err)
	}
	for _, err := range []error{
		nil, errors.New("anything"),
		wrap(sarama.ErrUnknownTopicOrPartition), wrap(sarama.ErrLeaderNotAvailable), wrap(sarama.ErrTopicAuthorizationFailed),
		wrap(sarama.ErrOutOfBrokers), sarama.ConfigurationError("Producing headers requires Kafka at least v0.11"),
		&amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x'"}, &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED"},
		&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED},
	} {
		require.False(t, broker.IsPermanentPublishError(err), "%v", err)
	}
}

// Kafka's own answer to a topic name it refuses, through watermill-kafka's publisher (which,
// unlike the broker package's, does not check names first), is recognised as permanent; the
// broker package's publisher refuses it before sending, marked permanent. (The embedded kfake
// broker accepts any name: the first part needs KAFKA_BROKERS.)
func TestIsPermanentPublishErrorOnKafkaInvalidTopic(t *testing.T) {
	t.Parallel()
	addrs := brokertest.KafkaBrokers(t)
	b, err := broker.New(context.Background(), nil, broker.Config{Kind: broker.Kafka, Kafka: broker.KafkaConfig{Brokers: addrs}}, nil)
	require.NoError(t, err)
	defer b.Close()
	bp, err := b.NewPublisher(context.Background())
	require.NoError(t, err)
	defer bp.Close()
	require.True(t, wmonce.IsPermanent(bp.Publish("bad!topic", message.NewMessage("m", nil))))

	if brokertest.RealKafka() == nil {
		t.Logf("kfake accepts any topic name: Kafka's own refusal is checked with %s only", broker.EnvKafkaBrokers)
		return
	}
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_1_0_0
	sc.Producer.Return.Successes = true
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: addrs, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc}, nil)
	require.NoError(t, err)
	defer pub.Close()
	err = pub.Publish("bad!topic", message.NewMessage("m", nil))
	require.ErrorIs(t, err, sarama.ErrInvalidTopic)
	require.True(t, broker.IsPermanentPublishError(err), "%v", err)
}
