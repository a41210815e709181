package brokertest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
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

// TopicGroups is a subscriber that subscribes each topic with a consumer group of its own,
// base + "." + a hash of the topic, so that no Kafka group spans two topics. The universal
// suite's TestTopic subscribes one subscriber (one group) to two topics; on Kafka the second
// member then rebalances the first, and watermill-kafka does not abandon a message it is
// waiting to hand over when the session ends, so that rebalance can wait up to the rebalance
// timeout — longer than the suite waits under load. Every other use of the suite's default
// group stays on one topic, so the group's continuity across subscribers is unchanged.
type TopicGroups struct {
	newSubscriber func(group string) (message.Subscriber, error)
	base          string

	mu   sync.Mutex
	subs []message.Subscriber
}

// NewTopicGroups returns a TopicGroups subscriber creating its subscribers with newSubscriber.
func NewTopicGroups(base string, newSubscriber func(group string) (message.Subscriber, error)) *TopicGroups {
	return &TopicGroups{newSubscriber: newSubscriber, base: base}
}

func (g *TopicGroups) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	sum := sha256.Sum256([]byte(topic))
	sub, err := g.newSubscriber(g.base + "." + hex.EncodeToString(sum[:6]))
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.subs = append(g.subs, sub)
	g.mu.Unlock()
	return sub.Subscribe(ctx, topic)
}

func (g *TopicGroups) Close() error {
	g.mu.Lock()
	subs := g.subs
	g.subs = nil
	g.mu.Unlock()
	var errs []error
	for _, s := range subs {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
