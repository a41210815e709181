package broker_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
)

// TestKafkaBrokerVersion names, in the test log (go test -v), the Kafka the Kafka tests of
// this run talk to: KAFKA_BROKERS, or the embedded kfake broker.
func TestKafkaBrokerVersion(t *testing.T) {
	addrs := brokertest.KafkaBrokers(t)
	v, err := brokertest.KafkaVersion(context.Background(), addrs)
	require.NoError(t, err)
	where := "KAFKA_BROKERS=" + strings.Join(addrs, ",")
	if brokertest.RealKafka() == nil {
		where = "embedded kfake at " + strings.Join(addrs, ",")
	}
	t.Logf("Kafka under test: %s; %s; client: Sarama, protocol version %s", where, v, broker.KafkaProtocolVersion)
}
