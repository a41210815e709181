// Command consumer is one consumer instance of the end-to-end suite, run as a child process so
// the suite can kill it with SIGKILL. It reads the broker configuration from the environment
// (broker.ConfigFromEnv) and the scenario's names from E2E_* variables, applies events until
// SIGTERM or SIGINT, and prints its totals on stdout every 100ms and at a clean exit.
// E2E_HANDLER=counter runs the read-modify-write counter under the library's defaults instead
// of the ledger; E2E_HANDLER=batch writes the ledger with a batch handler (scenario.BatchHandler).
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

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
	batch := os.Getenv(scenario.EnvHandler) == scenario.HandlerBatch
	delayed := os.Getenv(scenario.EnvInOrder) != "1"
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
	newConsumer := func() (*scenario.Consumer, message.Subscriber, error) {
		sub, err := b.NewSubscriber(group)
		if err != nil {
			return nil, nil, err
		}
		var c *scenario.Consumer
		if counter {
			c, err = scenario.NewCounterConsumer(db, sub, schema, topic, group, instance, logger)
		} else {
			c, err = scenario.NewConsumer(db, sub, schema, topic, need(scenario.EnvPoisonTopic), group, instance, batch, delayed, logger)
		}
		if err != nil {
			_ = sub.Close()
			return nil, nil, err
		}
		return c, sub, nil
	}
	var current atomic.Pointer[scenario.Consumer]
	report := func(final bool) {
		var s scenario.Stats // nothing applied yet if no router started
		if c := current.Load(); c != nil {
			s = c.Stats()
		}
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
	var closeMu sync.Mutex // orders a router's start against the close on SIGTERM
	go func() {
		<-ctx.Done()
		closeMu.Lock()
		defer closeMu.Unlock()
		if c := current.Load(); c != nil {
			_ = c.Router.Close()
		}
	}()
	// Router.Run returns an error only when a handler cannot subscribe, as when the broker is down
	// while the process starts (a Kafka broker killed right after a consumer restart). A
	// deployment's supervisor would start the process again; here the router is built again, like
	// Connect retries. Once the handlers run, Run returns nil when the router is closed.
	err = scenario.RetryStartup(ctx, "consumer", func() error {
		c, sub, err := newConsumer()
		if err != nil {
			return err
		}
		closeMu.Lock()
		if ctx.Err() != nil {
			closeMu.Unlock()
			_ = sub.Close()
			return nil
		}
		current.Store(c)
		closeMu.Unlock()
		if err := c.Router.Run(context.Background()); err != nil {
			// A router whose handler could not subscribe does not close its subscriber: the
			// next attempt builds its own, so this one's connections must go.
			_ = c.Router.Close()
			_ = sub.Close()
			return err
		}
		return nil
	})
	if err != nil && ctx.Err() == nil { // stopped while retrying is a clean stop
		return err
	}
	report(true)
	return nil
}
