// Command relay runs the real outbox.Relay of the chaos suite as a process of its own, so the
// suite can kill it with SIGKILL. It reads the broker configuration from the environment
// (broker.ConfigFromEnv) and the schema from E2E_SCHEMA, and lists every batch it published on
// stdout (E2E-PUBLISHED lines) so the suite can count republished events.
//
// E2E_RELAY_SELF_KILL=p makes the process SIGKILL itself, with probability p, right after a
// batch reached the broker and before the relay records its position: the window in which a
// crash makes the relay publish the same batch again. It is the real process dying there, not
// a publisher that pretends to fail.
package main

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/e2e/internal/scenario"
	"github.com/wmonce/watermill-once/outbox"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg, err := broker.ConfigFromEnv()
	if err != nil {
		return err
	}
	schema := scenario.MustEnv("relay", scenario.EnvSchema)
	selfKill := 0.0
	if v := os.Getenv(scenario.EnvRelaySelfKill); v != "" {
		if selfKill, err = strconv.ParseFloat(v, 64); err != nil {
			return fmt.Errorf("%s=%q: %w", scenario.EnvRelaySelfKill, v, err)
		}
	}
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false).With(watermill.LogFields{"process": "relay"})
	if cfg.Kind == broker.Kafka {
		// Sarama's own log (producer retries, admin requests) goes to the process log, for post-mortems.
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.LstdFlags|log.Lmicroseconds)
	}
	db, b, err := scenario.Connect(ctx, "relay", cfg, logger)
	if err != nil {
		return err
	}
	defer db.Close()
	defer b.Close()
	var pub message.Publisher
	if err := scenario.RetryStartup(ctx, "relay", func() (err error) { pub, err = b.NewPublisher(ctx); return err }); err != nil {
		return err
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(db, &reportingPublisher{next: pub, selfKill: selfKill}, outbox.RelayConfig{
		Schema: schema, BatchSize: 100, PollInterval: 250 * time.Millisecond,
		Backoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, StandbyInterval: 200 * time.Millisecond,
	}, logger)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); _ = relay.Close() }()
	if err := relay.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// reportingPublisher publishes through the broker, then lists what it published; with
// probability selfKill it then kills its own process.
type reportingPublisher struct {
	next     message.Publisher
	selfKill float64
	mu       sync.Mutex // keeps each E2E-PUBLISHED line whole when lanes publish concurrently
}

func (p *reportingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.next.Publish(topic, msgs...); err != nil {
		return err
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.UUID
	}
	p.mu.Lock()
	fmt.Println(scenario.PublishedPrefix + strings.Join(ids, ","))
	p.mu.Unlock()
	if p.selfKill > 0 && rand.Float64() < p.selfKill {
		fmt.Fprintln(os.Stderr, "relay: SIGKILL to myself after a publish, before the position update")
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal arrives; never return to the relay
	}
	return nil
}

func (p *reportingPublisher) Close() error { return nil }
