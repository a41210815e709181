// Package scaffold is the examples' shared plumbing, apart from the patterns they show: the
// broker configuration from the environment (with an embedded Kafka when none is named), the
// schema's migrations, and the goroutines an example starts and stops.
package scaffold

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/embeddedkafka"
	"github.com/wmonce/watermill-once/migrate"
)

// BrokerFromEnv reads the broker configuration from BROKER and friends (broker.ParseEnv). When
// BROKER=kafka and KAFKA_BROKERS is unset, it starts an embedded Kafka (kfake), says so on out,
// and points the configuration at it; stop closes it (call it when done, also on error).
func BrokerFromEnv(ctx context.Context, logger watermill.LoggerAdapter, out io.Writer) (cfg broker.Config, stop func(), err error) {
	getenv, stop := os.Getenv, func() {}
	if strings.EqualFold(os.Getenv(broker.EnvBroker), string(broker.Kafka)) && os.Getenv(broker.EnvKafkaBrokers) == "" {
		ek, err := embeddedkafka.Start(ctx, logger)
		if err != nil {
			return cfg, stop, err
		}
		stop = ek.Close
		addrs := strings.Join(ek.Addrs(), ",")
		getenv = func(k string) string {
			if k == broker.EnvKafkaBrokers {
				return addrs
			}
			return os.Getenv(k)
		}
		fmt.Fprintf(out, "started an embedded Kafka (kfake) at %s\n", addrs)
	}
	cfg, err = broker.ParseEnv(getenv)
	return cfg, stop, err
}

// Logger is Watermill's standard logger when verbose, else one that discards.
func Logger(verbose bool) watermill.LoggerAdapter {
	if verbose {
		return watermill.NewStdLogger(false, false)
	}
	return watermill.NopLogger{}
}

// Migrate brings schema up to the library's latest version.
func Migrate(ctx context.Context, db *sql.DB, schema string, logger watermill.LoggerAdapter) error {
	m, err := migrate.New(db, migrate.Config{Schema: schema}, logger)
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, migrate.DirectionUp, nil)
	return err
}

// InBackground runs fn until the returned stop is called, which calls closeFn and waits for fn
// to return. fn's context is not cancelled with ctx: stop ends it, as a deferred call.
func InBackground(ctx context.Context, fn func(context.Context) error, closeFn func() error) (stop func()) {
	done := make(chan struct{})
	go func() { defer close(done); _ = fn(context.WithoutCancel(ctx)) }()
	return func() { _ = closeFn(); <-done }
}

// StartRouter runs r in the background and returns once it is running, with the function that
// closes it and waits for Run to return.
func StartRouter(ctx context.Context, r *message.Router) (stop func(), err error) {
	var runErr error
	done := make(chan struct{})
	go func() { defer close(done); runErr = r.Run(context.WithoutCancel(ctx)) }()
	stop = func() { _ = r.Close(); <-done }
	select {
	case <-r.Running():
		return stop, nil
	case <-done:
		return nil, fmt.Errorf("router stopped: %w", runErr)
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}
}

// WaitUntil checks cond every 20ms (the examples pass in-memory counters: no query) until it
// holds, ctx ends or timeout passes.
func WaitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("timed out after %s", timeout)
		case <-tick.C:
		}
	}
	return nil
}

// RunID is prefix and eight random hex digits: names that no earlier run used.
func RunID(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
