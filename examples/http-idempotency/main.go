// Command http-idempotency is an HTTP service that creates payments safely under client
// retries: POST /payments requires an Idempotency-Key header, runs once per (client, key), and
// writes the payment and its PaymentCreated event (into the outbox) in the same transaction
// as the stored response. A relay forwards the event from the outbox to a broker; here an
// in-process GoChannel stands in for Kafka or RabbitMQ so the example needs only PostgreSQL.
//
//	go run ./examples/http-idempotency                 # serve on :8080
//	go run ./examples/http-idempotency -demo           # run a scripted client against it and exit
//
//	curl -i -X POST localhost:8080/payments -H 'Authorization: Bearer shop-1' \
//	     -H 'Idempotency-Key: 9f1c2b1e-order-1042' -d '{"amount_paise":240000,"currency":"INR","payee":"acme"}'
//
// Flags and environment: -addr (ADDR, default :8080), -database-url (DATABASE_URL), -schema
// (default wmonce). Tables are created by the embedded migrations on start.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

func main() {
	addr := flag.String("addr", envOr("ADDR", ":8080"), "listen address")
	databaseURL := flag.String("database-url", envOr("DATABASE_URL", pgtx.DefaultDatabaseURL), "PostgreSQL URL")
	schema := flag.String("schema", pgtx.DefaultSchema, "schema for watermill-once's tables and the example's payments table")
	demo := flag.Bool("demo", false, "start on a random local port, run a scripted client (request, retry, conflicting payload, missing key), print the results and exit")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *databaseURL, *schema, *demo); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, addr, databaseURL, schema string, demo bool) error {
	db, err := pgtx.Open(ctx, databaseURL, pgtx.PoolConfig{MaxOpenConns: 16})
	if err != nil {
		return err
	}
	defer db.Close()

	app, err := newApp(ctx, db, schema)
	if err != nil {
		return err
	}
	defer app.Close()

	if demo {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: app.Handler(), ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	defer func() {
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()

	if demo {
		return runDemo(ctx, os.Stdout, "http://"+ln.Addr().String(), app)
	}
	log.Printf("listening on %s (schema %s)", ln.Addr(), schema)
	select {
	case <-ctx.Done():
		return nil
	case err := <-serveErr:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
