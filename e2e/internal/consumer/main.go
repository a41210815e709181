// Command consumer is one consumer instance of the end-to-end suite, run as a child process so
// the suite can kill it with SIGKILL. It reads the broker configuration from the environment
// (broker.ConfigFromEnv) and the scenario's names from E2E_* variables, applies events until
// SIGTERM or SIGINT, and prints its totals on stdout every 100ms and at a clean exit.
// E2E_HANDLER=counter runs the read-modify-write counter under the library's defaults instead
// of the ledger.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/e2e/internal/scenario"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
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
	need := func(k string) string { return scenario.MustEnv("consumer", k) }
	schema, topic := need(scenario.EnvSchema), need(scenario.EnvTopic)
	group, instance := need(scenario.EnvGroup), need(scenario.EnvInstance)
	counter := os.Getenv(scenario.EnvHandler) == scenario.HandlerCounter
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false).With(watermill.LogFields{"instance": instance})
	if cfg.Kind == broker.Kafka {
		// Sarama's own log (group joins, rebalances) goes to the process log, for post-mortems.
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.LstdFlags|log.Lmicroseconds)
	}
	db, b, err := scenario.Connect(ctx, "consumer", cfg, logger)
	if err != nil {
		return err
	}
	defer db.Close()
	defer b.Close()
	sub, err := b.NewSubscriber(group)
	if err != nil {
		return err
	}
	var c *scenario.Consumer
	if counter {
		c, err = scenario.NewCounterConsumer(db, sub, schema, topic, group, instance, logger)
	} else {
		c, err = scenario.NewConsumer(db, sub, schema, topic, need(scenario.EnvPoisonTopic), group, instance, logger)
	}
	if err != nil {
		return err
	}

	report := func(final bool) {
		s := c.Stats()
		s.Final = final
		scenario.PrintStats(s)
	}
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				report(false)
			}
		}
	}()
	go func() {
		<-ctx.Done()
		_ = c.Router.Close()
	}()
	if err := c.Router.Run(context.Background()); err != nil {
		return err
	}
	report(true)
	return nil
}
