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
// It narrates each step and ends with one JSON line of measured figures, e.g.
// {"broker":"sql","deliveries":3,"applied":1,"cashback_paise":2400,"sms_sent":1}.
// Each run resets its own schemas (payments_demo*) and uses fresh topic names.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/embeddedpg"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	logger := logFor(os.Getenv("DEMO_VERBOSE") != "")
	opts := Options{Prefix: "payments_demo", Out: os.Stdout, Logger: logger}

	// BROKER=kafka without KAFKA_BROKERS: an embedded Kafka-protocol broker, announced by Run.
	getenv := os.Getenv
	if strings.EqualFold(strings.TrimSpace(os.Getenv(broker.EnvBroker)), string(broker.Kafka)) && strings.TrimSpace(os.Getenv(broker.EnvKafkaBrokers)) == "" {
		ek, err := broker.StartEmbeddedKafka(ctx, logger)
		if err != nil {
			fmt.Fprintln(os.Stderr, "payments demo:", err)
			os.Exit(1)
		}
		defer ek.Close()
		opts.EmbeddedKafka = ek
		getenv = func(k string) string {
			if k == broker.EnvKafkaBrokers {
				return strings.Join(ek.Addrs(), ",")
			}
			return os.Getenv(k)
		}
	}
	cfg, err := broker.ParseEnv(getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo:", err)
		os.Exit(2)
	}
	if os.Getenv(broker.EnvSQLSchema) == "" {
		cfg.SQL.Schema = "payments_demo_broker" // reset with the demo's schemas on every run
	}
	// No DATABASE_URL and no server on 127.0.0.1:5432: an embedded PostgreSQL, announced here.
	// Ctrl-C ends the run through ctx, so that the embedded server is stopped and removed.
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	dbURL, stopDB, err := openDatabase(ctx, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo:", err)
		os.Exit(1)
	}
	cfg.DatabaseURL = dbURL
	opts.Broker = cfg
	_, err = Run(ctx, opts)
	if stopErr := stopDB(); stopErr != nil {
		fmt.Fprintln(os.Stderr, "payments demo: stopping the embedded PostgreSQL:", stopErr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "payments demo failed:", err)
		os.Exit(1)
	}
}

// openDatabase returns DATABASE_URL when set, else what embeddedpg finds or starts (announced
// on stdout), and the function that stops an embedded server and removes its data. (The
// broker config cannot tell: ParseEnv fills in the default URL.)
func openDatabase(ctx context.Context, logger watermill.LoggerAdapter) (string, func() error, error) {
	opts := embeddedpg.Options{Out: os.Stdout}
	if _, quiet := logger.(errorsOnly); !quiet { // DEMO_VERBOSE: the server's log too
		opts.Log = os.Stderr
	}
	return embeddedpg.DatabaseURL(ctx, opts)
}

// logFor returns Watermill's logger on stderr: errors only, or everything from info up.
func logFor(verbose bool) watermill.LoggerAdapter {
	l := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	if verbose {
		return l
	}
	return errorsOnly{l}
}

type errorsOnly struct{ watermill.LoggerAdapter }

func (errorsOnly) Info(string, watermill.LogFields)  {}
func (errorsOnly) Debug(string, watermill.LogFields) {}
func (errorsOnly) Trace(string, watermill.LogFields) {}
func (e errorsOnly) With(f watermill.LogFields) watermill.LoggerAdapter {
	return errorsOnly{e.LoggerAdapter.With(f)}
}

// narrator prints the walk-through; the services narrate from their own goroutines.
type narrator struct {
	mu  *sync.Mutex
	out io.Writer
}

func newNarrator(out io.Writer) narrator { return narrator{mu: &sync.Mutex{}, out: out} }

func (n narrator) line(s string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	fmt.Fprintln(n.out, s)
}

func (n narrator) step(format string, args ...any) { n.line("==> " + fmt.Sprintf(format, args...)) }

func (n narrator) say(format string, args ...any) { n.line("    " + fmt.Sprintf(format, args...)) }
