package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// With one setting (Options.Debezium, DEMO_OUTBOX=debezium) the walk-through runs on
// Debezium's path: Debezium delivers e-91 once, the switch back to the Relay delivers it again,
// and the figures are those of the default walk-through: one cashback for three deliveries.
func TestWalkThroughDebezium(t *testing.T) {
	brokertest.SkipShort(t, "a Kafka Connect cluster with Debezium (e2e/services up connect)")
	db := pgtest.DB(t)
	prefix := pgtest.NewName("demo")
	t.Cleanup(func() {
		for _, s := range []string{"_payments", "_rewards", "_notifications"} {
			pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(prefix+s)+` CASCADE`)
		}
	})
	kafka := []string{"127.0.0.1:9094"} // the cluster the Connect workers of e2e/services write to
	if v := os.Getenv("CONNECT_KAFKA_BROKERS"); v != "" {
		kafka = strings.Split(v, ",")
	}
	cfg := broker.Config{Kind: broker.Kafka, DatabaseURL: pgtest.URL(), Kafka: broker.KafkaConfig{Brokers: kafka, SessionTimeout: 6 * time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := Run(ctx, Options{Broker: cfg, Prefix: prefix, Out: &out, Debezium: true})
	require.NoError(t, err, out.String())
	require.Equal(t, Result{Broker: "kafka", Deliveries: 3, Applied: 1, CashbackPaise: 2400, SMSSent: 1}, res)
	for _, want := range []string{
		"debezium: connector", "debezium: published e-91 to Kafka once",
		"switched back from Debezium to the Relay, which published e-91 AGAIN",
		"APPLIED: credited 2% cashback", "DUPLICATE absorbed",
	} {
		require.Contains(t, out.String(), want)
	}
	require.NotContains(t, out.String(), "relay #1")
}
