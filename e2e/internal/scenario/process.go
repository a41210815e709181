package scenario

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/pgtx"
)

// MustEnv returns the environment variable name, or exits with status 2 saying it is missing:
// the suite always sets it, so a missing one is a harness bug.
func MustEnv(process, name string) string {
	v := os.Getenv(name)
	if v == "" {
		fmt.Fprintf(os.Stderr, "%s: %s is not set\n", process, name)
		os.Exit(2)
	}
	return v
}

// PrintStats reports a process's totals on stdout, where the suite reads them.
func PrintStats(s Stats) {
	line, _ := json.Marshal(s)
	fmt.Println(StatsPrefix + string(line))
}

// Connect opens the database and the broker of cfg. Starting up while the fault injector
// terminates connections or restarts PostgreSQL fails now and then; a real deployment's
// supervisor would restart the process, here it retries for up to two minutes.
func Connect(ctx context.Context, process string, cfg broker.Config, logger watermill.LoggerAdapter) (*sql.DB, *broker.Broker, error) {
	var db *sql.DB
	var b *broker.Broker
	err := RetryStartup(ctx, process, func() error {
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
		if db != nil {
			_ = db.Close()
		}
		return nil, nil, err
	}
	return db, b, nil
}

// RetryStartup runs fn until it succeeds, ctx ends or two minutes have passed.
func RetryStartup(ctx context.Context, process string, fn func() error) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		fmt.Fprintln(os.Stderr, process+": start-up failed, retrying:", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
