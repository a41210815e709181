package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmonce/watermill-once/httpidem"
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

// app wires the service: migrations, the idempotency middleware, the outbox writer, and a
// relay from the outbox to an in-process broker.
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

func newApp(ctx context.Context, db *sql.DB, schema string) (*app, error) {
	logger := watermill.NewStdLogger(false, false)
	m, err := migrate.New(db, migrate.Config{Schema: schema}, logger)
	if err != nil {
		return nil, err
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
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
		return nil, fmt.Errorf("create payments table: %w", err)
	}

	// Keys are scoped by the Authorization header (hashed), kept 24 hours; 5xx are not stored.
	idem, err := httpidem.NewMiddleware(db, httpidem.Config{Schema: schema}, logger)
	if err != nil {
		return nil, err
	}
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	broker := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, logger)
	relay, err := outbox.NewRelay(db, broker, outbox.RelayConfig{Schema: schema, Name: "http-idempotency-example", PollInterval: 50 * time.Millisecond}, logger)
	if err != nil {
		return nil, err
	}
	a := &app{db: db, payments: payments, idem: idem, outbox: w, relay: relay, broker: broker,
		forwarded: map[string]int{}, notify: make(chan struct{}, 1)}

	events, err := broker.Subscribe(ctx, TopicPaymentCreated)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancel = cancel
	a.wg.Add(3)
	go func() { defer a.wg.Done(); a.consume(events) }()
	go func() { defer a.wg.Done(); _ = relay.Run(runCtx) }()
	go func() { defer a.wg.Done(); a.deleteExpiredKeys(runCtx, logger) }()
	return a, nil
}

// Close stops the relay, the janitor and the in-process broker.
func (a *app) Close() {
	a.cancel()
	_ = a.relay.Close()
	_ = a.broker.Close()
	a.wg.Wait()
}

// Handler routes requests. Only POST and PATCH pass through the idempotency middleware (its
// default Methods); GET is served directly.
func (a *app) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", a.createPayment)
	mux.HandleFunc("GET /payments/{id}", a.getPayment)
	return a.idem.Handler(mux)
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

// createPayment writes the payment and its event through the request's transaction: the
// middleware commits them together with the stored response, or none of them.
func (a *app) createPayment(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, ok := pgtx.TxFromContext(ctx)
	if !ok {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "no transaction: route not behind httpidem"})
		return
	}
	var in createRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "body must be JSON: " + err.Error()})
		return
	}
	if in.AmountPaise <= 0 || len(in.Currency) != 3 || in.Payee == "" {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": "amount_paise must be positive, currency a 3-letter code, payee non-empty"})
		return
	}
	// The event gets a UUID of its own, stored with the payment: it stays the same wherever the
	// event travels, so consumers can deduplicate on it (a sequence number would repeat after a
	// database restore).
	var p paymentResponse
	err := tx.QueryRowContext(ctx, `INSERT INTO `+a.payments+` (amount_paise, currency, payee, event_id) VALUES ($1, $2, $3, $4)
RETURNING id, amount_paise, currency, payee, event_id, created_at`, in.AmountPaise, in.Currency, in.Payee, watermill.NewUUID()).
		Scan(&p.ID, &p.AmountPaise, &p.Currency, &p.Payee, &p.EventID, &p.CreatedAt)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "could not create the payment"})
		return
	}
	payload, _ := json.Marshal(PaymentCreated{PaymentID: p.ID, AmountPaise: p.AmountPaise, Currency: p.Currency, Payee: p.Payee, CreatedAt: p.CreatedAt})
	if err := a.outbox.PublishTx(ctx, tx, TopicPaymentCreated, message.NewMessage(p.EventID, payload)); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "could not record the event"})
		return
	}
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(p.ID, 10))
	writeJSON(w, http.StatusCreated, p)
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
			if n, err := a.idem.DeleteExpired(ctx); err != nil {
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
