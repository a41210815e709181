package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// ensureKafkaTopic creates a topic with the configured partitions and replication factor; a
// topic that already exists is left as it is.
func (b *Broker) ensureKafkaTopic(ctx context.Context, topic string) error {
	b.kafkaMu.Lock()
	defer b.kafkaMu.Unlock()
	var created bool
	err := b.withKafkaAdmin(ctx, func(admin sarama.ClusterAdmin) error {
		err := admin.CreateTopic(topic, &sarama.TopicDetail{
			NumPartitions:     b.config.Kafka.Partitions,
			ReplicationFactor: b.config.Kafka.ReplicationFactor,
		}, false)
		created = err == nil
		if errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return nil // made by someone else, or by an attempt of ours whose answer was lost
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("broker: create Kafka topic %q: %w", topic, err)
	}
	if created {
		b.kafkaMade = append(b.kafkaMade, topic)
		b.logger.Info("Created Kafka topic", map[string]any{"topic": topic, "partitions": b.config.Kafka.Partitions})
	}
	return nil
}

// withKafkaAdmin runs fn with the admin client (b.kafkaMu held). When fn fails without an
// answer from the cluster (the connection broke, no broker answers), it replaces the admin
// client by a new one and tries again, with backoff, until ctx ends: a Sarama Broker never
// reconnects a connection that failed, so after the broker restarts (a crash, a rolling
// upgrade) the long-lived admin client would fail every request with EOF or "broken pipe"
// until it is replaced. An answer from the cluster (a Kafka error code) is returned as it is.
func (b *Broker) withKafkaAdmin(ctx context.Context, fn func(sarama.ClusterAdmin) error) error {
	backoff := 100 * time.Millisecond
	for {
		if b.kafkaAdmin == nil {
			return errors.New("broker: Kafka admin client is closed")
		}
		err := fn(b.kafkaAdmin)
		var answered sarama.KError
		if err == nil || errors.As(err, &answered) {
			return err
		}
		b.logger.Info("Kafka admin request failed without an answer from the cluster; reconnecting", map[string]any{"err": err.Error()})
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up reconnecting: %w)", err, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
		fresh, nerr := sarama.NewClusterAdmin(b.config.Kafka.Brokers, b.saramaConfig())
		if nerr != nil {
			continue // the cluster is still unreachable: the next attempt fails fast and waits again
		}
		_ = b.kafkaAdmin.Close()
		b.kafkaAdmin = fresh
	}
}

// CreatedKafkaTopics returns the topics this Broker created (not those it found existing), for
// tests and demos that delete their throw-away topics (DeleteKafkaTopics).
func (b *Broker) CreatedKafkaTopics() []string {
	b.kafkaMu.Lock()
	defer b.kafkaMu.Unlock()
	return append([]string(nil), b.kafkaMade...)
}

// DeleteKafkaTopics deletes topics (for tests and demos that create throw-away topics).
func (b *Broker) DeleteKafkaTopics(topics ...string) error {
	b.kafkaMu.Lock()
	defer b.kafkaMu.Unlock()
	if b.config.Kind != Kafka {
		return errors.New("broker: not a Kafka broker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), declareTimeout)
	defer cancel()
	var errs []error
	for _, t := range topics {
		err := b.withKafkaAdmin(ctx, func(admin sarama.ClusterAdmin) error {
			if err := admin.DeleteTopic(t); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
				return err
			}
			return nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("delete Kafka topic %q: %w", t, err))
		}
	}
	return errors.Join(errs...)
}
