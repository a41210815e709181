package brokerkfake_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/embeddedkafka"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TestKafkaPublishWaitsOutALeaderlessPartition: the partition answers NOT_LEADER_FOR_PARTITION
// to more produce requests than Sarama's idempotent producer retries (it retries without
// waiting), as a real Kafka did just after creating the topic; Publish waits it out.
func TestKafkaPublishWaitsOutALeaderlessPartition(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ek, b, topic := onePartitionKfake(t, ctx, "leaderless")

	const refusals = 25 // Sarama gives up after 1 + Producer.Retry.Max (10) attempts
	var refused atomic.Int32
	ek.Cluster().ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		ek.Cluster().KeepControl()
		if refused.Load() >= refusals {
			return nil, nil, false
		}
		refused.Add(1)
		return refuseProduce(req.(*kmsg.ProduceRequest), kerr.NotLeaderForPartition.Code), nil, true
	})

	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("a", []byte("1"))))
	require.EqualValues(t, refusals, refused.Load(), "every refusal was answered before the publish succeeded")

	sub, err := b.NewSubscriber("g")
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	got := receive(t, ch, 1, 30*time.Second)
	require.Equal(t, "a", got[0].UUID)
}

// TestKafkaPublishWaitsOutSaramasOpenBreaker: the broker does not know a new topic yet for
// long enough that Sarama's partition lookup fails three times and its circuit breaker
// refuses the topic for 10 s ("circuit breaker is open", seen on Kafka 4.4 while the
// universal suite created many topics at once). Publish waits it out.
func TestKafkaPublishWaitsOutSaramasOpenBreaker(t *testing.T) {
	if testing.Short() {
		t.Skip("sits out Sarama's 10 s circuit breaker: the full suite runs it, not -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ek, b, topic := onePartitionKfake(t, ctx, "breaker")
	require.NoError(t, b.Declare(ctx, broker.Subscription{Topic: topic, Group: "g"}))

	host, portStr, err := net.SplitHostPort(ek.Addrs()[0])
	require.NoError(t, err)
	port, err := strconv.Atoi(portStr)
	require.NoError(t, err)
	// The broker answers as if the topic were not created yet, for the client's first refresh
	// and then for longer than three lookups of the topic's partitions (each 1 +
	// Metadata.Retry.Max requests), which opens Sarama's breaker for 10 s.
	const leaderless = 1 + 3*11
	var answered atomic.Int32
	ek.Cluster().ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		ek.Cluster().KeepControl()
		m := req.(*kmsg.MetadataRequest)
		// The only topic of this cluster, asked for by name or as "all topics".
		ours := m.Topics == nil || len(m.Topics) == 1 && m.Topics[0].Topic != nil && *m.Topics[0].Topic == topic
		if !ours || answered.Load() >= leaderless {
			return nil, nil, false
		}
		answered.Add(1)
		resp := m.ResponseKind().(*kmsg.MetadataResponse)
		br := kmsg.NewMetadataResponseBroker()
		br.NodeID, br.Host, br.Port = ek.Cluster().CurrentNode(), host, int32(port)
		resp.Brokers = append(resp.Brokers, br)
		resp.ControllerID = br.NodeID
		if m.Topics != nil { // asked by name: not known yet; asked for all: there are none yet
			rt := kmsg.NewMetadataResponseTopic()
			rt.Topic = kmsg.StringPtr(topic)
			rt.ErrorCode = kerr.UnknownTopicOrPartition.Code
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})

	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("a", []byte("1"))))
	require.EqualValues(t, leaderless, answered.Load())
}

// refuseProduce answers every partition of a produce request with the error code.
func refuseProduce(p *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := p.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range p.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// kafkaRefusingProduce starts kfake with a one-partition topic; a produce request for which
// refuse (given the number of records it carries) returns true is answered with
// INVALID_RECORD, an error Sarama does not retry.
func kafkaRefusingProduce(t *testing.T, ctx context.Context, refuse func(records int32) bool) (*broker.Broker, string) {
	t.Helper()
	ek, b, topic := onePartitionKfake(t, ctx, "refuse")
	ek.Cluster().ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		ek.Cluster().KeepControl()
		p := req.(*kmsg.ProduceRequest)
		var records int32
		for _, rt := range p.Topics {
			for _, rp := range rt.Partitions {
				var batch kmsg.RecordBatch
				if err := batch.ReadFrom(rp.Records); err == nil {
					records += batch.NumRecords
				}
			}
		}
		if !refuse(records) {
			return nil, nil, false
		}
		return refuseProduce(p, kerr.InvalidRecord.Code), nil, true
	})
	return b, topic
}

func keyed(uuid, key string) *message.Message {
	m := message.NewMessage(uuid, []byte(uuid))
	m.Metadata.Set("partition_key", key)
	return m
}

// A Publish of many messages costs a few produce requests, not one per message (the outbox
// relay forwards a batch per call), and each key's messages arrive in the call's order.
// One partition, so the order of arrival is the order of writing.
func TestKafkaPublishSendsACallTogether(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var produced atomic.Int32
	b, topic := kafkaRefusingProduce(t, ctx, func(int32) bool { produced.Add(1); return false })
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("warm", nil))) // producer id, metadata

	// Sixty keys, one message each: one chunk. Sarama sends the first message at once and the
	// rest, buffered meanwhile, in the next request or two; one request per message would be 60.
	const n = 60
	var unique []*message.Message
	for i := range n {
		unique = append(unique, keyed("u"+strconv.Itoa(i), "u"+strconv.Itoa(i)))
	}
	before := produced.Load()
	require.NoError(t, pub.Publish(topic, unique...))
	require.LessOrEqual(t, produced.Load()-before, int32(n/4), "produce requests for %d messages with different keys", n)

	// Three keys: cut into chunks of three (each key once), sent one after the other.
	var msgs []*message.Message
	for i := range n {
		msgs = append(msgs, keyed(strconv.Itoa(i), "k"+strconv.Itoa(i%3)))
	}
	require.NoError(t, pub.Publish(topic, msgs...))

	sub, err := b.NewSubscriber("g")
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	got := receive(t, ch, 2*n+1, 30*time.Second)
	last := map[string]int{}
	for _, m := range got[n+1:] {
		i, err := strconv.Atoi(m.UUID)
		require.NoError(t, err)
		k := m.Metadata.Get("partition_key")
		if prev, ok := last[k]; ok {
			require.Greater(t, i, prev, "key %s out of order", k)
		}
		last[k] = i
	}
	require.Len(t, last, 3)
}

// When a message fails, no later message with its key has been sent: publishing the call
// again then keeps the key's order. Here both messages have one key and the first produce
// request of the call that carries a single record is refused. A publisher that handed the
// whole call to Sarama at once would send both in one request (not refused: the publish
// succeeds) or the first alone (refused) and the second in the next request (accepted: the
// key's second event would precede its first once the call is published again).
func TestKafkaPublishFailureLetsNoLaterMessageOfTheKeyThrough(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var armed, refused atomic.Bool
	b, topic := kafkaRefusingProduce(t, ctx, func(records int32) bool {
		return armed.Load() && records == 1 && !refused.Swap(true)
	})
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, keyed("warm", "k")))
	armed.Store(true)
	err = pub.Publish(topic, keyed("k-1", "k"), keyed("k-2", "k"))
	require.ErrorIs(t, err, sarama.ErrInvalidRecord)
	require.True(t, refused.Load())
	require.NoError(t, pub.Publish(topic, keyed("sentinel", "k")))

	sub, err := b.NewSubscriber("g")
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	var uuids []string
	for _, m := range receive(t, ch, 2, 30*time.Second) {
		uuids = append(uuids, m.UUID)
	}
	require.Equal(t, []string{"warm", "sentinel"}, uuids, "k-2 was never sent after k-1 failed")
}

// After OUT_OF_ORDER_SEQUENCE_NUMBER the publisher takes a new producer (a new producer id,
// asked for with InitProducerID), so that publishing the message again really writes it.
func TestKafkaPublishAfterOutOfOrderSequenceUsesANewProducer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ek, b, topic := onePartitionKfake(t, ctx, "outoforder")
	var initProducerID atomic.Int32
	var armed, refused atomic.Bool
	ek.Cluster().ControlKey(int16(kmsg.InitProducerID), func(kmsg.Request) (kmsg.Response, error, bool) {
		ek.Cluster().KeepControl()
		initProducerID.Add(1)
		return nil, nil, false
	})
	ek.Cluster().ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		ek.Cluster().KeepControl()
		if !armed.Load() || refused.Swap(true) {
			return nil, nil, false
		}
		return refuseProduce(req.(*kmsg.ProduceRequest), kerr.OutOfOrderSequenceNumber.Code), nil, true
	})
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	defer pub.Close()
	require.NoError(t, pub.Publish(topic, message.NewMessage("warm", nil)))
	producers := initProducerID.Load()
	armed.Store(true)
	err = pub.Publish(topic, message.NewMessage("a", nil))
	require.ErrorIs(t, err, sarama.ErrOutOfOrderSequenceNumber)
	require.True(t, refused.Load())
	require.Greater(t, initProducerID.Load(), producers, "a new producer asked for a producer id")
	require.NoError(t, pub.Publish(topic, message.NewMessage("a", nil)))

	sub, err := b.NewSubscriber("g")
	require.NoError(t, err)
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	got := receive(t, ch, 2, 30*time.Second)
	require.Equal(t, "a", got[len(got)-1].UUID)
}

// onePartitionKfake starts an embedded Kafka broker of t's own, for tests that make it misbehave,
// and a Broker on it with one partition per topic and the subscription (a new topic named after
// prefix, group "g") to declare. Both are closed when t ends.
func onePartitionKfake(t *testing.T, ctx context.Context, prefix string) (*embeddedkafka.Broker, *broker.Broker, string) {
	t.Helper()
	ek, err := embeddedkafka.Start(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(ek.Close)
	topic := pgtest.NewName(prefix)
	b, err := broker.New(ctx, nil, broker.Config{Kind: broker.Kafka, Kafka: broker.KafkaConfig{Brokers: ek.Addrs(), Partitions: 1},
		Subscriptions: []broker.Subscription{{Topic: topic, Group: "g"}}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return ek, b, topic
}
