package broker

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/eapache/go-resiliency/breaker"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/worker"
)

func (b *Broker) newKafkaPublisher() (message.Publisher, error) {
	newProducer := func() (sarama.SyncProducer, error) {
		producer, err := sarama.NewSyncProducer(b.config.Kafka.Brokers, b.saramaConfig())
		if err != nil {
			return nil, fmt.Errorf("broker: Kafka producer: %w", err)
		}
		return producer, nil
	}
	producer, err := newProducer()
	if err != nil {
		return nil, err
	}
	return &kafkaPublisher{producer: producer, newProducer: newProducer, marshaler: b.kafkaMarshaler(),
		backoff: 100 * time.Millisecond, timeout: kafkaPublishRetryTimeout}, nil
}

// kafkaPublishRetryTimeout bounds how long a message is retried on a leaderless partition.
const kafkaPublishRetryTimeout = 30 * time.Second // beyond Sarama's 10 s breaker

// kafkaPublisher sends the messages of one Publish call together and keeps the order of each
// record key, failures included.
//
// Batching: watermill-kafka's publisher waits for the acknowledgement of each message before
// sending the next, so a Publish of n messages costs n broker round trips, and the outbox relay
// forwards in strict order at most a few thousand messages per second to Kafka however many
// are waiting. Here the messages go to Sarama's SyncProducer.SendMessages, which sends what is
// buffered per broker in one produce request: a call costs a round trip or a few. (Sarama
// v1.43 got its idempotent producer's sequence numbers wrong under concurrent batches
// (OUT_OF_ORDER_SEQUENCE_NUMBER on Kafka 4.4, and once a message reported as sent that never
// arrived), so this publisher was withdrawn until v1.61.1, which fixed the retry buffers'
// sequence numbers: watermill's conformance suite under -race then went from errors in every
// run to none.)
//
// Order on failure: a call is cut into chunks in which no record key occurs twice, sent one
// after the other; a chunk is sent only once every message of the previous one is
// acknowledged. So when a message fails, no later message with its key has been sent, and
// when the caller publishes the call again (the relay does: it advances only after a whole
// call succeeded), each key's messages reach their partition in order, after copies of the
// ones that succeeded (the middleware drops those). Messages with different keys may be
// written in a different order than the call's when one of them fails and is retried: Kafka
// orders records only within a partition, and the consumer sees one key's records in order.
//
// Leaderless partitions: Sarama retries a batch Producer.Retry.Max times, does not retry a
// failed leader lookup, and after three failed lookups opens a circuit breaker that refuses
// the partition for 10 s; so a partition that is briefly leaderless (a topic just created,
// whose metadata the broker answers before it leads the new partition; a broker restarting)
// can fail a send within milliseconds. The messages of a chunk that failed that way are sent
// again with backoff, for up to kafkaPublishRetryTimeout; any other error, or one that lasts
// longer, is returned.
//
// OUT_OF_ORDER_SEQUENCE_NUMBER: the producer's idempotence state (producer id, sequence
// numbers) no longer matches the broker's, and publishing again through it has been seen to
// report a message as sent that never arrived (Sarama v1.43). The producer is replaced by a new
// one (a new producer id) and the error returned, so the caller's next attempt really writes.
// The old producer is closed with the publisher: closing it now could race with concurrent
// sends on it.
type kafkaPublisher struct {
	mu          sync.RWMutex
	producer    sarama.SyncProducer
	retired     []sarama.SyncProducer
	newProducer func() (sarama.SyncProducer, error)
	marshaler   kafka.Marshaler
	backoff     time.Duration
	timeout     time.Duration
	closed      bool
}

func (p *kafkaPublisher) current() (sarama.SyncProducer, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, errors.New("broker: Kafka publisher closed")
	}
	return p.producer, nil
}

// renew replaces failed by a new producer, unless a concurrent call already did.
func (p *kafkaPublisher) renew(failed sarama.SyncProducer) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.producer != failed {
		return nil
	}
	producer, err := p.newProducer()
	if err != nil {
		return err
	}
	p.retired = append(p.retired, p.producer)
	p.producer = producer
	return nil
}

func (p *kafkaPublisher) Publish(topic string, msgs ...*message.Message) error {
	records := make([]*sarama.ProducerMessage, len(msgs))
	keys := make([]string, len(msgs))
	for i, msg := range msgs {
		rec, err := p.marshal(topic, msg)
		if err != nil {
			return err
		}
		records[i], keys[i] = rec, recordKey(rec)
	}
	for start := 0; start < len(msgs); {
		end := chunkEnd(keys, start)
		if err := p.sendChunk(topic, msgs[start:end], records[start:end]); err != nil {
			return err
		}
		start = end
	}
	return nil
}

func (p *kafkaPublisher) marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	rec, err := p.marshaler.Marshal(topic, msg)
	if err != nil { // a reserved metadata key, a missing partition key: the same every time
		return nil, wmonce.Permanent(fmt.Errorf("broker: marshal message %s for Kafka: %w", msg.UUID, err))
	}
	return rec, nil
}

// chunkEnd returns the end of the chunk that starts at start: the longest run of messages whose
// record keys are all different.
func chunkEnd(keys []string, start int) int {
	seen := make(map[string]struct{}, len(keys)-start)
	for i := start; i < len(keys); i++ {
		if _, dup := seen[keys[i]]; dup {
			return i
		}
		seen[keys[i]] = struct{}{}
	}
	return len(keys)
}

func recordKey(rec *sarama.ProducerMessage) string {
	if rec.Key == nil {
		return ""
	}
	b, err := rec.Key.Encode()
	if err != nil {
		return ""
	}
	return string(b)
}

// sendChunk sends msgs (no two with one record key), first as records (msgs marshalled), and
// sends those that failed on a leaderless partition again, with backoff, until
// kafkaPublishRetryTimeout. Every retry sends freshly marshalled records: Sarama keeps
// per-send state (sequence numbers, retry counts) in the record it was given.
func (p *kafkaPublisher) sendChunk(topic string, msgs []*message.Message, records []*sarama.ProducerMessage) error {
	deadline := time.Now().Add(p.timeout)
	backoff := worker.Backoff{Base: p.backoff, Max: time.Second}
	for {
		producer, err := p.current()
		if err != nil {
			return err
		}
		if records == nil {
			if records, err = p.marshalAll(topic, msgs); err != nil {
				return err
			}
		}
		err = producer.SendMessages(records)
		if err == nil {
			return nil
		}
		var failed sarama.ProducerErrors
		if !errors.As(err, &failed) {
			return fmt.Errorf("broker: Kafka publish to %s: %w", topic, err)
		}
		again, err := p.sendAgain(producer, topic, records, failed)
		if err != nil {
			return err
		}
		if err := p.pause(topic, msgs, failed, backoff.Next(), deadline); err != nil {
			return err
		}
		msgs, records = pickAgain(msgs, again), nil
	}
}

// pause waits before the failed records are sent again, unless that would pass deadline or the
// messages' context ends first: then the error says what was not acknowledged.
func (p *kafkaPublisher) pause(topic string, msgs []*message.Message, failed sarama.ProducerErrors, wait time.Duration, deadline time.Time) error {
	if time.Now().Add(wait).After(deadline) {
		return fmt.Errorf("broker: Kafka publish to %s: %d of %d messages not acknowledged after %s: %w", topic, len(failed), len(msgs), p.timeout, failed[0].Err)
	}
	if !worker.Sleep(msgs[0].Context(), wait) {
		return fmt.Errorf("broker: Kafka publish to %s: %w (gave up: %w)", topic, failed[0].Err, msgs[0].Context().Err())
	}
	return nil
}

// marshalAll marshals msgs into fresh records.
func (p *kafkaPublisher) marshalAll(topic string, msgs []*message.Message) ([]*sarama.ProducerMessage, error) {
	records := make([]*sarama.ProducerMessage, len(msgs))
	for i, msg := range msgs {
		var err error
		if records[i], err = p.marshal(topic, msg); err != nil {
			return nil, err
		}
	}
	return records, nil
}

// sendAgain marks the records (by index) that failed on a leaderless partition and may be
// sent again; any other failure is the error. An out-of-order sequence number renews the
// producer first: the caller publishes the messages again, through the new producer.
func (p *kafkaPublisher) sendAgain(producer sarama.SyncProducer, topic string, records []*sarama.ProducerMessage, failed sarama.ProducerErrors) ([]bool, error) {
	index := make(map[*sarama.ProducerMessage]int, len(records))
	for i, rec := range records {
		index[rec] = i
	}
	again := make([]bool, len(records))
	for _, f := range failed {
		if errors.Is(f.Err, sarama.ErrOutOfOrderSequenceNumber) {
			err := fmt.Errorf("broker: Kafka publish to %s: %w", topic, f.Err)
			if rerr := p.renew(producer); rerr != nil {
				return nil, errors.Join(err, rerr)
			}
			return nil, err
		}
		if !leaderless(f.Err) {
			return nil, fmt.Errorf("broker: Kafka publish to %s: %w", topic, f.Err)
		}
		if i, ok := index[f.Msg]; ok {
			again[i] = true
		}
	}
	return again, nil
}

// pickAgain is the messages marked again, in the call's order (SendMessages reports the
// failed ones in any order).
func pickAgain(msgs []*message.Message, again []bool) []*message.Message {
	var rest []*message.Message
	for i, msg := range msgs {
		if again[i] {
			rest = append(rest, msg)
		}
	}
	return rest
}

func (p *kafkaPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for _, producer := range append(p.retired, p.producer) {
		if err := producer.Close(); err != nil {
			errs = append(errs, fmt.Errorf("broker: close Kafka producer: %w", err))
		}
	}
	return errors.Join(errs...)
}

// leaderless reports errors that mean "this partition has no usable leader right now": the
// ones Sarama itself retries, except a corrupt message, and Sarama's open circuit breaker
// around leader and partition lookups.
func leaderless(err error) bool {
	for _, e := range []error{sarama.ErrNotLeaderForPartition, sarama.ErrLeaderNotAvailable, sarama.ErrUnknownTopicOrPartition,
		sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend, sarama.ErrRequestTimedOut, sarama.ErrKafkaStorageError,
		breaker.ErrBreakerOpen} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
