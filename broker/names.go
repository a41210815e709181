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
	rule, ok := topicRules[kind]
	switch {
	case !ok:
		return fmt.Errorf("unknown broker kind %q", kind)
	case !rule.valid(topic):
		return fmt.Errorf("topic %q is not valid for %s", topic, rule.says)
	}
	return nil
}

// topicRules are the topic names each broker kind carries, and what its error says is allowed.
var topicRules = map[Kind]struct {
	valid func(topic string) bool
	says  string
}{
	SQL: {sqlTopic.MatchString, "the SQL broker: use 1-45 characters from A-Z a-z 0-9 - $ : . _"},
	Kafka: {func(t string) bool { return kafkaTopic.MatchString(t) && t != "." && t != ".." },
		"Kafka: use 1-249 characters from A-Z a-z 0-9 . _ -"},
	AMQP: {func(t string) bool { return amqpName.MatchString(t) && !strings.HasPrefix(t, "amq.") },
		`RabbitMQ: use 1-200 characters from A-Z a-z 0-9 - _ . : not starting with "amq."`},
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
