package broker

import (
	"fmt"
	"regexp"
	"strings"
)

// Topic and group name rules. SQL topics become table names ("watermill_offsets_" + topic must
// fit PostgreSQL's 63 bytes), Kafka allows [a-zA-Z0-9._-] up to 249 bytes, and RabbitMQ
// exchange and queue names allow letters, digits, '-', '_', '.', ':' up to 255 bytes.
var (
	sqlTopic   = regexp.MustCompile(`^[A-Za-z0-9\-$:._]{1,45}$`)
	kafkaTopic = regexp.MustCompile(`^[A-Za-z0-9._\-]{1,249}$`)
	amqpName   = regexp.MustCompile(`^[A-Za-z0-9\-_.:]{1,200}$`)
	groupName  = regexp.MustCompile(`^[A-Za-z0-9\-_.]{1,100}$`)
)

// validateTopic checks that topic can be carried by the broker kind, with an error saying
// what is allowed.
func validateTopic(kind Kind, topic string) error {
	switch kind {
	case SQL:
		if !sqlTopic.MatchString(topic) {
			return fmt.Errorf("topic %q is not valid for the SQL broker: use 1-45 characters from A-Z a-z 0-9 - $ : . _", topic)
		}
	case Kafka:
		if !kafkaTopic.MatchString(topic) || topic == "." || topic == ".." {
			return fmt.Errorf("topic %q is not valid for Kafka: use 1-249 characters from A-Z a-z 0-9 . _ -", topic)
		}
	case AMQP:
		if !amqpName.MatchString(topic) || strings.HasPrefix(topic, "amq.") {
			return fmt.Errorf("topic %q is not valid for RabbitMQ: use 1-200 characters from A-Z a-z 0-9 - _ . : not starting with \"amq.\"", topic)
		}
	default:
		return fmt.Errorf("unknown broker kind %q", kind)
	}
	return nil
}

// TopicValidator returns a check that a topic can be carried by the broker kind, with an error
// saying what is allowed. Pass it as outbox.Config.ValidateTopic so that a topic the broker
// would refuse fails the producing transaction instead of blocking the relay.
func TopicValidator(kind Kind) func(topic string) error {
	return func(topic string) error { return validateTopic(kind, topic) }
}

// validateGroup checks a consumer group name: 1-100 characters from A-Z a-z 0-9 - _ .
// A colon is refused because the RabbitMQ queue name is <topic>:<group>, which must not be
// ambiguous.
func validateGroup(group string) error {
	if !groupName.MatchString(group) {
		return fmt.Errorf("consumer group %q is not valid: use 1-100 characters from A-Z a-z 0-9 - _ .", group)
	}
	return nil
}
