package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// TopicPaymentCreated receives one PaymentCreated event per created payment.
const TopicPaymentCreated = "payments.created"

// PaymentCreated is the event emitted through the outbox.
type PaymentCreated struct {
	PaymentID   int64     `json:"payment_id"`
	AmountPaise int64     `json:"amount_paise"`
	Currency    string    `json:"currency"`
	Payee       string    `json:"payee"`
	CreatedAt   time.Time `json:"created_at"`
}

// app is the service (newApp, in main.go).
type app struct {
	db       *sql.DB
	payments string
	idem     *httpidem.Middleware
	outbox   *outbox.Writer
	relay    *outbox.Relay
	broker   *gochannel.GoChannel
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu        sync.Mutex
	forwarded map[string]int // event UUID -> times the broker delivered it
	notify    chan struct{}
}

// createTables applies watermill-once's migrations to schema and creates the example's
// payments table, whose qualified name it returns.
func createTables(ctx context.Context, db *sql.DB, schema string, logger watermill.LoggerAdapter) (string, error) {
	m, err := migrate.New(db, migrate.Config{Schema: schema}, logger)
	if err != nil {
		return "", err
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	payments := pgtx.QualifiedName(schema, "example_payments")
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+payments+` (
    id           bigserial   PRIMARY KEY,
    amount_paise bigint      NOT NULL CHECK (amount_paise > 0),
    currency     text        NOT NULL,
    payee        text        NOT NULL,
    event_id     text        NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return "", fmt.Errorf("create payments table: %w", err)
	}
	return payments, nil
}

// start runs the relay, a consumer of the broker standing in for a downstream service, and the
// janitor of expired idempotency keys, until Close.
func (a *app) start(ctx context.Context, logger watermill.LoggerAdapter) error {
	events, err := a.broker.Subscribe(ctx, TopicPaymentCreated)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	a.wg.Add(3)
	go func() { defer a.wg.Done(); a.consume(events) }()
	go func() { defer a.wg.Done(); _ = a.relay.Run(runCtx) }()
	go func() { defer a.wg.Done(); a.deleteExpiredKeys(runCtx, logger) }()
	return nil
}

// Close stops the relay, the janitor and the in-process broker.
func (a *app) Close() {
	a.cancel()
	_ = a.relay.Close()
	_ = a.broker.Close()
	a.wg.Wait()
}

type createRequest struct {
	AmountPaise int64  `json:"amount_paise"`
	Currency    string `json:"currency"`
	Payee       string `json:"payee"`
}

type paymentResponse struct {
	ID          int64     `json:"id"`
	AmountPaise int64     `json:"amount_paise"`
	Currency    string    `json:"currency"`
	Payee       string    `json:"payee"`
	CreatedAt   time.Time `json:"created_at"`
	EventID     string    `json:"event_id"`
}

func (a *app) getPayment(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such payment"})
		return
	}
	var p paymentResponse
	err = a.db.QueryRowContext(r.Context(), `SELECT id, amount_paise, currency, payee, event_id, created_at FROM `+a.payments+` WHERE id = $1`, id).
		Scan(&p.ID, &p.AmountPaise, &p.Currency, &p.Payee, &p.EventID, &p.CreatedAt)
	if err != nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such payment"})
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// consume stands in for a downstream service: it records which events the broker delivered.
func (a *app) consume(events <-chan *message.Message) {
	for msg := range events {
		a.mu.Lock()
		a.forwarded[msg.UUID]++
		a.mu.Unlock()
		select {
		case a.notify <- struct{}{}:
		default:
		}
		msg.Ack()
	}
}

// deleteExpiredKeys removes stored responses past their retention once an hour.
func (a *app) deleteExpiredKeys(ctx context.Context, logger watermill.LoggerAdapter) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n, err := a.idem.Prune(ctx); err != nil {
				logger.Error("Deleting expired idempotency keys failed", err, nil)
			} else if n > 0 {
				logger.Info("Deleted expired idempotency keys", watermill.LogFields{"count": n})
			}
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// serve runs the service on addr until Ctrl-C or, with demo, runs the scripted client against
// it on a random local port and returns.
func serve(addr, databaseURL, schema string, demo bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
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
