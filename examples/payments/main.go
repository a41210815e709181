// Command payments walks through watermill-once end to end, on the broker chosen by BROKER
// (sql when unset: only PostgreSQL is needed; kafka: KAFKA_BROKERS, or an embedded
// Kafka-protocol broker when unset; amqp: AMQP_URL). PostgreSQL is DATABASE_URL, else the server
// on 127.0.0.1:5432, else an embedded one started for the run (not as root; see
// internal/embeddedpg):
//
//  1. payments commits pay_42 SUCCESS and its PaymentSucceeded event e-91 in one transaction;
//  2. its relay publishes e-91, crashes before recording its position, restarts and publishes
//     e-91 again;
//  3. rewards credits 2% cashback (1,200.00 -> 24.00, kept as 2400 paise) exactly once, and
//     emits CashbackCredited through its own outbox in the same transaction;
//  4. an operator redrives e-91: a third copy under a new transport id, same event id;
//  5. notifications records the SMS intent once, and its sender calls a fake SMS provider with an
//     Idempotency-Key derived from (consumer, event id, step); the sender "crashes" after the
//     provider accepted, retries, and the provider recognises the key.
//
// DEMO_OUTBOX=debezium (with BROKER=kafka on the Kafka Connect cluster's broker) runs step 2 on
// Debezium's path instead: its connector publishes e-91 once, then payments switches back to
// the Relay, which publishes it again (debezium.go).
//
// It narrates each step and ends with one JSON line of measured figures, e.g.
// {"broker":"sql","deliveries":3,"applied":1,"cashback_paise":2400,"sms_sent":1}.
// Each run resets its own schemas (payments_demo*) and uses fresh topic names.
//
// This file is the walk-through; services.go holds the three services' handlers, and setup.go,
// relay.go, narrate.go and sms.go the scaffolding around them.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/embeddedkafka"
	"github.com/wmonce/watermill-once/outbox"
)

func main() {
	os.Exit(runFromEnv()) // the broker and PostgreSQL from the environment, then Run
}

// Options configure one run of the walk-through.
type Options struct {
	Broker broker.Config
	// Prefix names the schemas the run resets and uses: <Prefix>_payments, _rewards,
	// _notifications (and the SQL broker's, when it starts with Prefix).
	Prefix string
	Out    io.Writer
	Logger watermill.LoggerAdapter
	// EmbeddedKafka is the embedded broker Broker.Kafka points at, if the caller started one
	// (announced in the narration). With BROKER=kafka and no brokers at all, Run starts one.
	EmbeddedKafka *embeddedkafka.Broker
	// Debezium forwards the payments outbox with Debezium on Kafka Connect for step 2, then
	// switches back to the Relay (debezium.go). Env DEMO_OUTBOX=debezium; Kafka only.
	Debezium bool
}

// Result is the final JSON line: every figure is measured, none is a constant.
type Result struct {
	Broker        string `json:"broker"`
	Deliveries    int    `json:"deliveries"`     // copies of e-91 the rewards consumer received
	Applied       int    `json:"applied"`        // cashback_credits rows for pay_42
	CashbackPaise int64  `json:"cashback_paise"` // their sum
	SMSSent       int    `json:"sms_sent"`       // SMS the provider actually sent
}

const (
	paymentID   = "pay_42"
	eventID     = "e-91"
	amountPaise = 120000 // 1,200.00
	phone       = "+91-98765-43210"
)

// Run performs the walk-through and prints the narration and the JSON line to opts.Out. It
// returns an error if a step fails or a figure is not what exactly-once requires.
func Run(ctx context.Context, opts Options) (Result, error) {
	d, err := setUp(ctx, opts) // the broker, PostgreSQL, each service's schema, this run's topics
	if err != nil {
		return Result{}, err
	}
	defer d.close()
	// rewards and notifications consume from the start, each behind the effectively-once
	// middleware, with its own schema (dedupe table, outbox, business rows).
	rewards, notifications, err := d.startServices(ctx)
	if err != nil {
		return Result{}, err
	}
	if opts.Debezium {
		if err := d.startDebezium(ctx); err != nil {
			return Result{}, err
		}
	}

	// 1. payments: the payment row and its event commit together.
	event, err := pay(ctx, d.db, d.schemas.payments, d.topics.payments)
	if err != nil {
		return Result{}, err
	}
	d.n.step("payments: committed %s SUCCESS (%s) and PaymentSucceeded %s in ONE transaction (payments row + outbox row)", paymentID, rupees(amountPaise), eventID)

	// 2. the relay publishes, crashes before recording its position, and a new relay publishes again.
	relayCfg := outbox.RelayConfig{Schema: d.schemas.payments, Name: "payments-relay", Backoff: 50 * time.Millisecond}
	if opts.Debezium { // 2'. Debezium publishes once, then the service switches back to the Relay
		if err := d.debeziumThenRelay(ctx, rewards, relayCfg); err != nil {
			return Result{}, err
		}
	} else if err := d.relayCrashAndRestart(ctx, relayCfg); err != nil {
		return Result{}, err
	}

	// 3. rewards applies the first copy and absorbs the second (it narrates each delivery), and
	// forwards its own outbox (CashbackCredited) from now on.
	if err := waitFor(ctx, "rewards to receive both copies", func() bool { return rewards.deliveries.Load() >= 2 }); err != nil {
		return Result{}, err
	}
	rewardsRelay, err := outbox.NewRelay(d.db, d.pub, outbox.RelayConfig{Schema: d.schemas.rewards, Name: "rewards-relay"}, d.logger)
	if err != nil {
		return Result{}, err
	}
	go func() { _ = rewardsRelay.Run(d.services) }()
	defer rewardsRelay.Close()

	// 4. an operator redrives e-91: a third copy, new transport id, same event id.
	redrive := message.NewMessage(eventID, event.Payload)
	for k, v := range event.Metadata {
		redrive.Metadata.Set(k, v)
	}
	if err := d.pub.Publish(d.topics.payments, redrive); err != nil {
		return Result{}, fmt.Errorf("redrive: %w", err)
	}
	d.n.step("ops: redrove %s from the dead-letter archive: a third copy under a NEW transport id (%s), SAME event id", eventID, d.pub.last())
	if err := waitFor(ctx, "rewards to receive the redriven copy", func() bool { return rewards.deliveries.Load() >= 3 }); err != nil {
		return Result{}, err
	}

	// 5. notifications: SMS intent recorded once, sent through the provider with an idempotency key.
	go notifications.sendLoop(d.services)
	if err := waitFor(ctx, "the SMS to be sent and marked SENT", func() bool { return notifications.sent(ctx) >= 1 }); err != nil {
		return Result{}, err
	}
	return d.result(ctx, rewards, notifications) // measured, narrated, checked
}

// relayCrashAndRestart is step 2: relay #1 publishes e-91 and crashes before recording its
// position; relay #2 starts from the recorded position and publishes it again.
func (d *demo) relayCrashAndRestart(ctx context.Context, relayCfg outbox.RelayConfig) error {
	if err := relayThenCrash(ctx, d.db, d.pub, relayCfg); err != nil {
		return err
	}
	d.n.step("relay #1: published %s to the broker (transport %s) and CRASHED before recording its position", eventID, d.pub.last())
	relay2, err := outbox.NewRelay(d.db, d.pub, relayCfg, d.logger)
	if err != nil {
		return err
	}
	if err := untilDone(ctx, "relay #2 republishing e-91", func() (bool, error) {
		k, err := relay2.RelayOnce(ctx)
		return k == 1, err
	}); err != nil {
		return err
	}
	d.n.step("relay #2: restarted from the recorded position and published %s AGAIN (transport %s); position recorded", eventID, d.pub.last())
	return nil
}
