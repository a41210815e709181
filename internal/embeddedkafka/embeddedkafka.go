// Package embeddedkafka runs an in-process broker that speaks the Kafka protocol (franz-go's
// kfake), for the demo and the tests only: it is internal so that no user binary links it.
package embeddedkafka

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Broker is an in-process broker that speaks the Kafka protocol (franz-go's kfake),
// listening on 127.0.0.1. It keeps everything in memory: it is for demos and tests, never for
// data you want to keep. Child processes can connect to it while this process lives.
type Broker struct {
	cluster *kfake.Cluster
	addrs   []string
}

// Start starts a single-broker kfake cluster. Topics are created on demand with
// 16 partitions (the broker package's default), and consumer groups accept session timeouts from one
// second, so tests can use short ones. It stops when ctx ends or Close is called.
func Start(ctx context.Context, logger watermill.LoggerAdapter) (*Broker, error) {
	return StartOn(ctx, logger, 0)
}

// StartOn is Start on a fixed port of 127.0.0.1 (0: any free port), for cmd/kfake, which
// serves the broker to other processes.
func StartOn(ctx context.Context, logger watermill.LoggerAdapter, port int) (*Broker, error) {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(16), // the broker package's default KafkaConfig.Partitions
		kfake.GroupMinSessionTimeout(time.Second),
		kfake.WithLogger(kfakeLogger{logger}),
	}
	if port != 0 {
		opts = append(opts, kfake.Ports(port))
	}
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("broker: start embedded Kafka (kfake): %w", err)
	}
	e := &Broker{cluster: cluster, addrs: cluster.ListenAddrs()}
	context.AfterFunc(ctx, e.Close)
	return e, nil
}

// Addrs returns the bootstrap addresses, for KafkaConfig.Brokers.
func (e *Broker) Addrs() []string { return append([]string(nil), e.addrs...) }

// Close stops the broker; everything it held is gone. It is idempotent.
func (e *Broker) Close() { e.cluster.Close() }

type kfakeLogger struct{ l watermill.LoggerAdapter }

func (k kfakeLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	msg := "kfake: " + strings.TrimSpace(fmt.Sprintf(format, args...))
	switch level {
	case kfake.LogLevelError:
		k.l.Error(msg, nil, nil)
	case kfake.LogLevelWarn, kfake.LogLevelInfo:
		k.l.Debug(msg, nil)
	default:
		k.l.Trace(msg, nil)
	}
}

// Cluster returns the kfake cluster, for tests that inject faults or observe requests
// (kfake.Cluster.ControlKey).
func (e *Broker) Cluster() *kfake.Cluster { return e.cluster }

// StartAddrs starts a broker that lives as long as the process and returns its addresses: the
// shape of brokertest.StartEmbeddedKafka, which the e2e and examples tests set to it so that
// their Kafka tests run on kfake when KAFKA_BROKERS is unset.
func StartAddrs() ([]string, error) {
	b, err := Start(context.Background(), watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	return b.Addrs(), nil
}
