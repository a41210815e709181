package brokertest

import (
	"strings"
	"testing"
)

// SuiteGroup is the consumer group for the default constructor of Watermill's universal suite
// (tests.TestPubSub): one group per test function of the suite, shared by the subscribers that
// function creates. One group for every parallel test function works on RabbitMQ and SQL
// (groups are per topic there) but not on Kafka, where each new member on any topic rebalances
// the whole group and stalls the other test functions' topics.
func SuiteGroup(t *testing.T) string {
	if parts := strings.Split(t.Name(), "/"); len(parts) > 1 {
		return "test-" + parts[1]
	}
	return "test"
}
