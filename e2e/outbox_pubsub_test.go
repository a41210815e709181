package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
)

// The outbox pipeline seen as one Pub/Sub, run through Watermill's universal suite
// (pubsub/tests.TestPubSub):
//
//	Publish   = outbox.Writer.DBPublisher: each call commits its messages to the outbox table
//	            in a transaction of its own;
//	(relay)   = one outbox.Relay per test, forwarding committed rows to the broker's publisher;
//	Subscribe = the broker's subscriber for the suite's consumer group.
//
// Every suite function publishes through the whole pipeline, so each one checks it end to end:
// UUID, payload and metadata survive the envelope (TestPublishSubscribe), concurrent committing
// transactions are all relayed (TestConcurrentSubscribe, TestPublisherClose: 50 and 20
// goroutines publishing at once), runs of many topics through one relay
// (TestConcurrentSubscribeMultipleTopics, TestTopic), commit order kept from the outbox to the
// subscriber (TestPublishSubscribeInOrder), and each consumer group receiving every relayed
// message (TestConsumerGroups). The subscriber-side functions (TestResendOnError, TestNoAck,
// TestContinueAfterErrors, TestContinueAfterSubscribeClose, TestConcurrentClose,
// TestMessageCtx, TestSubscribeCtx) cost little and show the relayed messages behave like any
// others. Skipped by Features: TestNewSubscriberReceivesOldMessages (a new subscriber of the
// group continues from the group's position) and TestReconnect (no restart command; broker
// connection faults are the job of the fault suite, Run).
//
// Features: at least once (ExactlyOnceDelivery false: the relay republishes after a crash
// between publishing and recording its position), Persistent, ConsumerGroups.
// GuaranteedOrder is the broker's: the relay publishes in commit order and DBPublisher commits
// each call before it returns, so sequential Publish calls reach the broker in call order.

// outboxPipeline builds the pipeline for kind, isolated for t (the outbox and, for the SQL
// broker, the topic tables in the test's schema; its own RabbitMQ vhost; unique topic names on
// Kafka), and returns the suite's two constructors. When t ends, it checks that the relay set
// no row aside as undecodable.
func outboxPipeline(t *testing.T, kind broker.Kind, relayConfig outbox.RelayConfig) (tests.PubSubConstructor, tests.ConsumerGroupPubSubConstructor) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	db := pgtest.OpenDB(t, 24)
	schema := pgtest.Schema(t, db)
	pgtest.WatchOldTransactions(t, 5*time.Second) // a failure names what stalled the SQL reads
	cfg := brokertest.Config(t, kind, schema)
	// The outbox pipeline declares queue order to the universal suite: one message in flight.
	cfg.AMQP.Workers, cfg.AMQP.Prefetch = 1, 1
	b, err := broker.New(ctx, db, cfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	brokertest.DeleteCreatedKafkaTopics(t, b)
	brokerPub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, brokerPub.Close()) })

	writer, err := outbox.NewWriter(outbox.Config{Schema: schema, ValidateTopic: broker.TopicValidator(kind)})
	require.NoError(t, err)
	relayConfig.Schema = schema
	relayConfig.PollInterval = 10 * time.Millisecond
	relayConfig.StandbyInterval = 100 * time.Millisecond
	relay, err := outbox.NewRelay(db, brokerPub, relayConfig, watermill.NopLogger{})
	require.NoError(t, err)
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = relay.Run(ctx) }()
	t.Cleanup(func() {
		require.NoError(t, relay.Close())
		<-relayDone
		st := relay.Counters()
		t.Logf("relay: %d messages forwarded in %d rounds, %d failed attempts retried", st.Forwarded, st.Rounds, st.Failures)
		require.Zero(t, st.Rejected, "the relay set rows aside as undecodable (outbox_rejected)")
	})

	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		sub, err := b.NewSubscriber(group)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() }) // idempotent; some suite functions leave theirs open
		return writer.DBPublisher(db), sub
	}
	// One consumer group per test function of the suite (see brokertest.SuiteGroup); on Kafka one
	// per topic as well (see brokertest.TopicGroups).
	return func(t *testing.T) (message.Publisher, message.Subscriber) {
		if kind == broker.Kafka {
			sub := brokertest.NewTopicGroups(brokertest.SuiteGroup(t), b.NewSubscriber)
			t.Cleanup(func() { _ = sub.Close() })
			return writer.DBPublisher(db), sub
		}
		return withGroup(t, brokertest.SuiteGroup(t))
	}, withGroup
}

func outboxFeatures() tests.Features {
	return tests.Features{
		ConsumerGroups:                   true,
		ExactlyOnceDelivery:              false,
		Persistent:                       true,
		NewSubscriberReceivesOldMessages: false,
		ForceShort:                       true,
		// "obx-" + a UUID, plus the suite's "-N" suffixes, fits the SQL broker's 45 characters.
		GenerateTopicFunc: func(tctx tests.TestContext) string { return "obx-" + string(tctx.TestID) },
	}
}

// TestOutboxConformanceSQL: outbox -> relay -> SQL Pub/Sub. Order holds with several
// subscribers of one group (they take turns on the group's offset row).
func TestOutboxConformanceSQL(t *testing.T) {
	t.Parallel()
	pubSub, withGroup := outboxPipeline(t, broker.SQL, outbox.RelayConfig{})
	features := outboxFeatures()
	features.GuaranteedOrder = true
	tests.TestPubSub(t, features, pubSub, withGroup)
}

// TestOutboxConformanceAMQP: outbox -> relay -> RabbitMQ (our publisher and subscriber). Order
// holds for a single subscriber of a group's queue.
func TestOutboxConformanceAMQP(t *testing.T) {
	t.Parallel()
	pubSub, withGroup := outboxPipeline(t, broker.AMQP, outbox.RelayConfig{})
	features := outboxFeatures()
	features.GuaranteedOrder = true
	features.GuaranteedOrderWithSingleSubscriber = true
	tests.TestPubSub(t, features, pubSub, withGroup)
}

// TestOutboxConformanceKafka: outbox -> relay -> Kafka. No global order: records are keyed by
// UUID (the suite sets no partition key) and spread over partitions.
func TestOutboxConformanceKafka(t *testing.T) {
	t.Parallel()
	pubSub, withGroup := outboxPipeline(t, broker.Kafka, outbox.RelayConfig{})
	tests.TestPubSub(t, outboxFeatures(), pubSub, withGroup)
}

// TestOutboxConformanceKafkaLanes is the Kafka pipeline with the relay publishing each batch
// over concurrent Publish calls (RelayConfig.PublishLanes), the setting meant for Kafka. Lanes
// keep order per key only; the suite claims no order on Kafka anyway.
func TestOutboxConformanceKafkaLanes(t *testing.T) {
	t.Parallel()
	pubSub, withGroup := outboxPipeline(t, broker.Kafka, outbox.RelayConfig{PublishLanes: 8})
	tests.TestPubSub(t, outboxFeatures(), pubSub, withGroup)
}
