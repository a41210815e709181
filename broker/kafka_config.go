package broker

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/internal/setup"
)

// The Kafka broker's defaults (KafkaConfig).
const (
	defaultKafkaPartitions = 16
	// defaultKafkaReplicationFactor asks the cluster for its default.replication.factor.
	defaultKafkaReplicationFactor = -1
	defaultPartitionKeyField      = "partition_key"
	defaultKafkaClientID          = "watermill-once"
	defaultKafkaSessionTimeout    = 10 * time.Second
)

// KafkaConfig configures Watermill's Kafka Pub/Sub (Sarama).
type KafkaConfig struct {
	// Brokers are the bootstrap addresses. Env KAFKA_BROKERS (comma-separated). Required.
	Brokers []string
	// Partitions of the topics created here; they bound the messages a group has in flight
	// (docs/performance.md). Env KAFKA_PARTITIONS; default 16.
	Partitions int32
	// ReplicationFactor of the topics created here; -1: the cluster's default. Env
	// KAFKA_REPLICATION_FACTOR; default -1.
	ReplicationFactor int16
	// PartitionKeyField is the metadata field that keys the record (one value, one partition, in
	// order); without it, the UUID. Env KAFKA_PARTITION_KEY; default "partition_key".
	PartitionKeyField string
	// RequirePartitionKey refuses to publish a message without PartitionKeyField instead of
	// falling back to its UUID.
	RequirePartitionKey bool
	// ClientID identifies this client to the brokers. Default "watermill-once".
	ClientID string
	// SessionTimeout is how long the coordinator waits for a silent consumer before moving its
	// partitions; within the cluster's group.min/max.session.timeout.ms. Env
	// KAFKA_SESSION_TIMEOUT (a Go duration); default 10s.
	SessionTimeout time.Duration
	// NackDelay is the wait before a nacked message is delivered again. Default 100ms.
	NackDelay time.Duration
}

func (k *KafkaConfig) setDefaults() {
	k.Partitions = cmp.Or(k.Partitions, defaultKafkaPartitions)
	k.ReplicationFactor = cmp.Or(k.ReplicationFactor, defaultKafkaReplicationFactor)
	k.PartitionKeyField = cmp.Or(k.PartitionKeyField, defaultPartitionKeyField)
	k.ClientID = cmp.Or(k.ClientID, defaultKafkaClientID)
	k.SessionTimeout = cmp.Or(k.SessionTimeout, defaultKafkaSessionTimeout)
	k.NackDelay = cmp.Or(k.NackDelay, defaultNackDelay)
}

// checkBrokerAddrs refuses an empty list of bootstrap addresses, and each that is not host:port.
func checkBrokerAddrs(brokers []string) []error {
	if len(brokers) == 0 {
		return []error{fmt.Errorf("no Kafka brokers: set %s (host:port[,host:port...]) or point it at a running cluster", EnvKafkaBrokers)}
	}
	var errs []error
	for _, b := range brokers {
		if b == "" || strings.ContainsAny(b, " /") || !strings.Contains(b, ":") {
			errs = append(errs, fmt.Errorf("Kafka broker address %q is not host:port", b))
		}
	}
	return errs
}

func (k KafkaConfig) validate() error {
	errs := []error{
		setup.AtLeast("Kafka.Partitions ("+EnvKafkaPartitions+")", k.Partitions, 1),
		setup.AtLeast("Kafka.SessionTimeout", k.SessionTimeout, time.Second),
		setup.NotNegative("Kafka.NackDelay", k.NackDelay),
	}
	errs = append(errs, checkBrokerAddrs(k.Brokers)...)
	if k.ReplicationFactor < -1 || k.ReplicationFactor == 0 {
		errs = append(errs, fmt.Errorf("Kafka.ReplicationFactor (%s) must be -1 (cluster default) or at least 1, got %d", EnvKafkaReplication, k.ReplicationFactor))
	}
	if strings.TrimSpace(k.PartitionKeyField) != k.PartitionKeyField {
		errs = append(errs, fmt.Errorf("Kafka.PartitionKeyField %q has surrounding spaces", k.PartitionKeyField))
	}
	return errors.Join(errs...)
}
