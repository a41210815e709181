package broker

import (
	"errors"
	"strings"

	"github.com/IBM/sarama"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	amqp "github.com/rabbitmq/amqp091-go"

	wmonce "github.com/wmonce/watermill-once"
)

// IsPermanentPublishError reports whether a publish error says the broker refuses these
// messages for good (an invalid topic, a record too large, ...; the list is in
// docs/outbox-relay.md); everything else, a missing topic or a lost connection included, is
// transient. Use it as outbox.RelayConfig.IsPermanent with a publisher this package did not
// build: NewPublisher's publishers already mark these errors with wmonce.Permanent.
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
