// Command producer commits events of the chaos suite (an order row and its OrderPlaced event in
// one transaction, scenario.Produce) as a process of its own: E2E_PRODUCE_COUNT events numbered
// from E2E_PRODUCE_FROM, E2E_PRODUCE_PACE apart. It keeps trying an event through PostgreSQL
// restarts and terminated connections, and reports how many it committed.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/e2e/internal/scenario"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "producer:", err)
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
	need := func(k string) string { return scenario.MustEnv("producer", k) }
	schema, topic, instance := need(scenario.EnvSchema), need(scenario.EnvTopic), need(scenario.EnvInstance)
	from, err1 := strconv.Atoi(need(scenario.EnvProduceFrom))
	count, err2 := strconv.Atoi(need(scenario.EnvProduceCount))
	pace, err3 := time.ParseDuration(need(scenario.EnvProducePace))
	if err1 != nil || err2 != nil || err3 != nil {
		return fmt.Errorf("bad %s/%s/%s", scenario.EnvProduceFrom, scenario.EnvProduceCount, scenario.EnvProducePace)
	}
	db, err := pgtx.Open(ctx, cfg.DatabaseURL, pgtx.PoolConfig{MaxOpenConns: 2})
	if err != nil {
		return err
	}
	defer db.Close()
	w, err := outbox.NewWriter(outbox.Config{Schema: schema, ValidateTopic: broker.TopicValidator(cfg.Kind)})
	if err != nil {
		return err
	}
	stats := scenario.Stats{Instance: instance}
	for n := from; n < from+count; n++ {
		ev := scenario.Event{OrderID: fmt.Sprintf("o-%06d", n), Amount: int64(100 + n%997)}
		if err := scenario.ProduceUntil(ctx, db, w, schema, topic, ev, fmt.Sprintf("customer-%d", n%7), 2*time.Minute); err != nil {
			return err
		}
		stats.Produced++
		scenario.PrintStats(stats)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pace):
		}
	}
	stats.Final = true
	scenario.PrintStats(stats)
	return nil
}
