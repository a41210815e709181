package broker

import (
	"errors"
	"strings"

	"github.com/IBM/sarama"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	amqp "github.com/rabbitmq/amqp091-go"

	wmonce "github.com/wmonce/watermill-once"
)

// IsPermanentPublishError reports whether a publish error says that the broker, or the
// publisher before sending, refuses these messages as they are, so that publishing them again
// can never succeed. It is meant for outbox.RelayConfig.IsPermanent with a publisher that
// this package did not build (watermill-kafka's, watermill-amqp's, watermill-sql's): the
// publishers of NewPublisher already mark what it recognises with wmonce.Permanent, which
// the relay's default recognises.
//
// It is deliberately narrow; everything else is transient:
//   - an error marked with wmonce.Permanent;
//   - Kafka: an invalid topic name (INVALID_TOPIC_EXCEPTION), a record larger than the broker
//     accepts (MESSAGE_TOO_LARGE) or than Sarama's Producer.MaxMessageBytes, a record the
//     broker's validation refuses (INVALID_RECORD);
//   - RabbitMQ: a message larger than the server's max_message_size;
//   - Watermill's SQL Pub/Sub: a topic name it cannot store (sql.ErrInvalidTopicName).
//
// A topic that does not exist (UNKNOWN_TOPIC_OR_PARTITION, an exchange or table missing), a
// partition without a leader, an authorization failure (an operator can grant it), a timeout
// and a lost connection are transient.
func IsPermanentPublishError(err error) bool {
	if err == nil {
		return false
	}
	if wmonce.IsPermanent(err) {
		return true
	}
	for _, kerr := range []error{sarama.ErrInvalidTopic, sarama.ErrMessageSizeTooLarge, sarama.ErrInvalidRecord, wsql.ErrInvalidTopicName} {
		if errors.Is(err, kerr) {
			return true
		}
	}
	// Sarama refuses a record above Producer.MaxMessageBytes before sending it, with a
	// ConfigurationError that it also uses for settings wrong for every message: match the text.
	var cerr sarama.ConfigurationError
	if errors.As(err, &cerr) && strings.Contains(string(cerr), "larger than configured Producer.MaxMessageBytes") {
		return true
	}
	var aerr *amqp.Error
	if errors.As(err, &aerr) {
		return aerr.Code == amqp.ContentTooLarge ||
			aerr.Code == amqp.PreconditionFailed && strings.Contains(aerr.Reason, "larger than configured max size")
	}
	return false
}

// permanentPublish marks the errors of a publisher built here that IsPermanentPublishError
// recognises, so that the outbox relay sets the refused message aside instead of retrying it.
func permanentPublish(err error) error {
	if err == nil || wmonce.IsPermanent(err) || !IsPermanentPublishError(err) {
		return err
	}
	return wmonce.Permanent(err)
}
