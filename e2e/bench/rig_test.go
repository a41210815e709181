package main

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/embeddedkafka"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TestRigLeavesE2EKafkaTopicsToTheVariant: a Kafka topic keeps the partitions it is created
// with, so if the rig created the e2e variants' topics with its own partitions (one per message
// in flight), e2e-50 and e2e-1000 would measure those instead of the broker's default.
func TestRigLeavesE2EKafkaTopicsToTheVariant(t *testing.T) {
	db := pgtest.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kb, err := embeddedkafka.Start(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(kb.Close)
	runID := "rigtest"
	e2e := broker.Subscription{Topic: e2eTopic(runID, E2E1000), Group: "e2e-" + E2E1000}
	r, err := newRig(ctx, db, rigOptions{
		kind: broker.Kafka, databaseURL: pgtest.URL(), schema: pgtest.NewName("wmonce_bench_rig"),
		runID: runID, inFlight: 8, kafkaAddrs: kb.Addrs(), extraSubs: []broker.Subscription{e2e},
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.close(context.Background()) })
	require.NotContains(t, r.b.CreatedKafkaTopics(), e2e.Topic,
		"the e2e variant creates its topic with the partitions it measures")
	require.Contains(t, r.extraTopics(), e2e.Topic, "the rig still deletes it at the end")
}
