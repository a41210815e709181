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
//
// This file is the pattern; setup.go (tables, relay, server) and demo.go (the scripted client)
// are the scaffolding around it.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"log"
	"net/http"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

func main() {
	addr := flag.String("addr", envOr("ADDR", ":8080"), "listen address")
	databaseURL := flag.String("database-url", envOr("DATABASE_URL", pgtx.DefaultDatabaseURL), "PostgreSQL URL")
	schema := flag.String("schema", pgtx.DefaultSchema, "schema for watermill-once's tables and the example's payments table")
	demo := flag.Bool("demo", false, "start on a random local port, run a scripted client (request, retry, conflicting payload, missing key), print the results and exit")
	flag.Parse()
	if err := serve(*addr, *databaseURL, *schema, *demo); err != nil { // until Ctrl-C, or the end of -demo
		log.Fatal(err)
	}
}

// newApp wires the service: the idempotency middleware, the outbox writer, and a relay from the
// outbox to an in-process broker.
func newApp(ctx context.Context, db *sql.DB, schema string) (*app, error) {
	logger := watermill.NewStdLogger(false, false)
	payments, err := createTables(ctx, db, schema, logger) // watermill-once's and example_payments
	if err != nil {
		return nil, err
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
	relay, err := outbox.NewRelay(db, broker, outbox.RelayConfig{Schema: schema, Name: "http-idempotency-example"}, logger)
	if err != nil {
		return nil, err
	}
	a := &app{db: db, payments: payments, idem: idem, outbox: w, relay: relay, broker: broker,
		forwarded: map[string]int{}, notify: make(chan struct{}, 1)}
	if err := a.start(ctx, logger); err != nil { // the relay, a stand-in consumer, the expired-key janitor
		return nil, err
	}
	return a, nil
}

// Handler routes requests. Only POST and PATCH pass through the idempotency middleware (its
// default Methods); GET is served directly.
func (a *app) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", a.createPayment)
	mux.HandleFunc("GET /payments/{id}", a.getPayment)
	return a.idem.Handler(mux)
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
