// Command consumer is one consumer instance of the end-to-end suite, run as a child process so
// the suite can kill it with SIGKILL. It reads the broker configuration from the environment
// (broker.ConfigFromEnv) and the scenario's names from E2E_* variables, applies events until
// SIGTERM or SIGINT, and prints its totals on stdout every 100ms and at a clean exit.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
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
	"github.com/wmonce/watermill-once/pgtx"
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
	need := func(k string) string {
		v := os.Getenv(k)
		if v == "" {
			fmt.Fprintf(os.Stderr, "consumer: %s is not set\n", k)
			os.Exit(2)
		}
		return v
	}
	schema, topic, poison := need(scenario.EnvSchema), need(scenario.EnvTopic), need(scenario.EnvPoisonTopic)
	group, instance := need(scenario.EnvGroup), need(scenario.EnvInstance)
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false).With(watermill.LogFields{"instance": instance})
	if cfg.Kind == broker.Kafka {
		// Sarama's own log (group joins, rebalances) goes to the process log, for post-mortems.
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.LstdFlags|log.Lmicroseconds)
	}

	// Starting up while the fault injector terminates connections fails now and then; a real
	// deployment's supervisor would restart the process, here we retry.
	var db *sql.DB
	var b *broker.Broker
	err = retry(ctx, func() error {
		if db == nil {
			var err error
			if db, err = pgtx.Open(ctx, cfg.DatabaseURL, pgtx.PoolConfig{MaxOpenConns: 8}); err != nil {
				return err
			}
		}
		var err error
		b, err = broker.New(ctx, db, cfg, logger)
		return err
	})
	if err != nil {
		return err
	}
	defer db.Close()
	defer b.Close()
	sub, err := b.NewSubscriber(group)
	if err != nil {
		return err
	}
	c, err := scenario.NewConsumer(db, sub, schema, topic, poison, group, instance, logger)
	if err != nil {
		return err
	}

	report := func(final bool) {
		s := c.Stats()
		s.Final = final
		line, _ := json.Marshal(s)
		fmt.Println(scenario.StatsPrefix + string(line))
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

func retry(ctx context.Context, fn func() error) error {
	var err error
	for range 40 {
		if err = fn(); err == nil {
			return nil
		}
		fmt.Fprintln(os.Stderr, "consumer: start-up failed, retrying:", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return err
}
