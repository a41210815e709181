package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TestExample runs the example against each broker (SQL on PostgreSQL, Kafka on KAFKA_BROKERS
// or an embedded kfake, RabbitMQ in a throw-away vhost): every event is applied once and in
// per-account order, copies are acked without a row, the refused and the undecodable events are
// parked where the example says.
func TestExample(t *testing.T) {
	t.Parallel()
	for _, kind := range broker.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			db := pgtest.DB(t)
			schema := pgtest.Schema(t, db)
			cfg := brokertest.Config(t, kind, schema)
			topic := pgtest.NewName("payments")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			s, err := run(ctx, db, options{broker: cfg, schema: schema, topic: topic, events: 200, timeout: 90 * time.Second, out: &out})
			t.Log("\n" + out.String())
			require.NoError(t, err)
			if kind == broker.Kafka {
				t.Cleanup(func() { deleteKafkaTopic(t, cfg, topic) })
			}

			require.Equal(t, 200, s.Published)
			require.Equal(t, uint64(201), s.Receiver.Stored, "every event plus the undecodable one")
			require.GreaterOrEqual(t, s.Receiver.Duplicates, uint64(s.DuplicateCopies), "brokers may redeliver more, never less")
			require.Equal(t, uint64(1), s.Receiver.Refused)
			require.Equal(t, uint64(200), s.Processor.Processed)
			require.Equal(t, uint64(1), s.Processor.Parked)
			require.Equal(t, 200, s.CashbackRows)
			require.Equal(t, 200, s.GrantedInOutbox)
			require.Zero(t, s.OrderViolations)
			require.Equal(t, 1, s.Poisoned)
			require.Len(t, s.ParkedRows, 1)
			require.Contains(t, s.ParkedRows[0].LastError, "does not decode")
			require.Equal(t, 1, s.Skipped)
		})
	}
}

func deleteKafkaTopic(t *testing.T, cfg broker.Config, topic string) {
	b, err := broker.New(context.Background(), nil, cfg, nil)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer b.Close()
	if err := b.DeleteKafkaTopics(topic); err != nil {
		t.Logf("cleanup: %v", err)
	}
}
