package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/outbox/cdc"
)

// The walk-through's Debezium variant (DEMO_OUTBOX=debezium, BROKER=kafka on the cluster the
// Kafka Connect workers write to: e2e/services up, KAFKA_BROKERS=127.0.0.1:9094): the
// payments outbox is read by Debezium's connector instead of the Relay for step 2, then the
// service switches back to the Relay, which publishes e-91 again; rewards absorbs the copy as
// it absorbs the Relay's republish in the default walk-through.

// EnvDemoOutbox selects what forwards the payments outbox: "relay" (default) or "debezium".
const EnvDemoOutbox = "DEMO_OUTBOX"

// debeziumFromEnv reads EnvDemoOutbox.
func debeziumFromEnv() (bool, error) {
	switch v := os.Getenv(EnvDemoOutbox); v {
	case "", "relay":
		return false, nil
	case "debezium":
		return true, nil
	default:
		return false, fmt.Errorf("%s=%q: want relay or debezium", EnvDemoOutbox, v)
	}
}

// startDebezium registers the payments outbox's connector and waits until its task reads
// the slot: events committed before the slot exists are not read (snapshot.mode=no_data). The
// connector, slot and publication are removed when the run closes.
func (d *demo) startDebezium(ctx context.Context) error {
	if d.cfg.Kind != broker.Kafka {
		return fmt.Errorf("%s=debezium needs BROKER=kafka (Debezium writes to Kafka)", EnvDemoOutbox)
	}
	client := cdc.Client{URL: cmp.Or(os.Getenv("CONNECT_URL"), cdc.DefaultConnectURL)}
	conn := cdc.Config{Schema: d.schemas.payments, DatabaseURL: d.cfg.DatabaseURL, User: cdc.DefaultReplicationRole}.WithDefaults()
	if err := cdc.Prepare(ctx, d.db, conn); err != nil {
		return err
	}
	if err := client.Apply(ctx, conn); err != nil {
		return err
	}
	d.push(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = cdc.Remove(ctx, client, d.db, conn)
	})
	if err := untilDone(ctx, "the Debezium connector to run", func() (bool, error) {
		s, err := client.Status(ctx, conn.Name)
		if err != nil && !cdc.IsNotFound(err) {
			return false, err
		}
		slot, err := cdc.Slot(ctx, d.db, conn)
		return err == nil && s.Running() && slot.Active, err
	}); err != nil {
		return err
	}
	d.n.step("debezium: connector %s runs on Kafka Connect (worker %s), reading the payments outbox from the WAL (slot %s)", conn.Name, d.workerOf(ctx, client, conn.Name), conn.SlotName)
	return nil
}

func (d *demo) workerOf(ctx context.Context, client cdc.Client, name string) string {
	s, err := client.Status(ctx, name)
	if err != nil || len(s.Tasks) == 0 {
		return "?"
	}
	return s.Tasks[0].WorkerID
}

// debeziumThenRelay is step 2 on the Debezium path: Debezium delivers e-91 once; then payments
// switches back to its Relay, which starts from the beginning of the outbox and publishes e-91
// again.
func (d *demo) debeziumThenRelay(ctx context.Context, rewards *rewardsService, relayCfg outbox.RelayConfig) error {
	if err := waitFor(ctx, "rewards to receive Debezium's copy", func() bool { return rewards.deliveries.Load() >= 1 }); err != nil {
		return err
	}
	d.n.step("debezium: published %s to Kafka once (exactly-once source); rewards received it", eventID)
	relay, err := outbox.NewRelay(d.db, d.pub, relayCfg, d.logger)
	if err != nil {
		return err
	}
	if err := untilDone(ctx, "the relay republishing e-91", func() (bool, error) {
		k, err := relay.RelayOnce(ctx)
		return k == 1, err
	}); err != nil {
		return err
	}
	d.n.step("relay: switched back from Debezium to the Relay, which published %s AGAIN (transport %s)", eventID, d.pub.last())
	return nil
}
