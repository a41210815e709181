package broker

import (
	"errors"
	"slices"
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
	return err != nil && slices.ContainsFunc(permanentRefusals, func(refused func(error) bool) bool { return refused(err) })
}

// permanentRefusals recognise the refusals for good, one broker (or marking) each.
var permanentRefusals = []func(error) bool{wmonce.IsPermanent, isRefusedByCode, isTooLargeForSarama, isTooLargeForRabbitMQ}

// refusedCodes are the errors Kafka (through Sarama) and watermill-sql return for a message
// they can never take as it is.
var refusedCodes = []error{sarama.ErrInvalidTopic, sarama.ErrMessageSizeTooLarge, sarama.ErrInvalidRecord, wsql.ErrInvalidTopicName}

func isRefusedByCode(err error) bool {
	return slices.ContainsFunc(refusedCodes, func(code error) bool { return errors.Is(err, code) })
}

// isTooLargeForSarama: Sarama refuses a record above Producer.MaxMessageBytes before sending it,
// with a ConfigurationError that it also uses for settings wrong for every message: match the
// text.
func isTooLargeForSarama(err error) bool {
	var cerr sarama.ConfigurationError
	return errors.As(err, &cerr) && strings.Contains(string(cerr), "larger than configured Producer.MaxMessageBytes")
}

// isTooLargeForRabbitMQ: a message above the server's max_message_size.
func isTooLargeForRabbitMQ(err error) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && (aerr.Code == amqp.ContentTooLarge ||
		aerr.Code == amqp.PreconditionFailed && strings.Contains(aerr.Reason, "larger than configured max size"))
}

// permanentPublish marks the errors of a publisher built here that IsPermanentPublishError
// recognises, so that the outbox relay sets the refused message aside instead of retrying it.
func permanentPublish(err error) error {
	if err == nil || wmonce.IsPermanent(err) || !IsPermanentPublishError(err) {
		return err
	}
	return wmonce.Permanent(err)
}
