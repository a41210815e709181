package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// pay is the payments service: one transaction writes the payment and stores its event in the
// outbox, so the event exists if and only if the payment does.
func pay(ctx context.Context, db *sql.DB, schema, topic string) (*message.Message, error) {
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	payload, _ := json.Marshal(paymentSucceeded{Type: "PaymentSucceeded", PaymentID: paymentID, AmountPaise: amountPaise, Phone: phone})
	msg := message.NewMessage(eventID, payload)
	msg.Metadata.Set("partition_key", paymentID)
	msg.Metadata.Set("event_type", "PaymentSucceeded")
	err = pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+pgtx.QualifiedName(schema, "payments")+` (id, status, amount_paise, phone) VALUES ($1, 'SUCCESS', $2, $3)`, paymentID, amountPaise, phone); err != nil {
			return err
		}
		return w.PublishTx(ctx, tx, topic, msg)
	})
	if err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	return msg, nil
}

type paymentSucceeded struct {
	Type        string `json:"type"`
	PaymentID   string `json:"payment_id"`
	AmountPaise int64  `json:"amount_paise"`
	Phone       string `json:"phone"`
}

type cashbackCredited struct {
	Type        string `json:"type"`
	PaymentID   string `json:"payment_id"`
	AmountPaise int64  `json:"amount_paise"`
	Phone       string `json:"phone"`
}

// rewardsService credits 2% cashback per PaymentSucceeded, effectively once, and emits
// CashbackCredited through its own outbox in the same transaction.
type rewardsService struct {
	router     *message.Router
	mw         *once.Middleware
	outbox     message.Publisher
	schema     string
	cashback   string
	n          narrator
	deliveries atomic.Int64
	// credited holds the deliveries whose handler ran, until observe reads it: the middleware
	// calls the handler only for a fresh claim. Per delivery, unlike the middleware's Counters,
	// which a concurrent delivery moves too. Keyed by the delivery number observe puts in the
	// metadata: the handler gets a copy of the message (its Ack and Nack are its own), so the
	// pointer is not the delivery's.
	credited sync.Map // delivery number -> bool (false: the payment was credited before)
}

// metadataDelivery carries observe's delivery number to the handler's copy of the message.
const metadataDelivery = "demo_delivery"

func newRewards(db *sql.DB, b *broker.Broker, schema, inTopic, outTopic string, n narrator, logger watermill.LoggerAdapter) (*rewardsService, error) {
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "rewards"}, logger)
	if err != nil {
		return nil, err
	}
	w, err := outbox.NewWriter(outbox.Config{Schema: schema, ValidateTopic: broker.TopicValidator(b.Kind())})
	if err != nil {
		return nil, err
	}
	r := &rewardsService{mw: mw, outbox: w.Publisher(), schema: schema, cashback: outTopic, n: n}
	if r.router, err = consumerRouter(b, "rewards", inTopic, mw, r.observe, r.handle, logger); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *rewardsService) handle(msg *message.Message) error {
	var ev paymentSucceeded
	if err := json.Unmarshal(msg.Payload, &ev); err != nil || ev.PaymentID == "" {
		return wmonce.Permanent(fmt.Errorf("not a PaymentSucceeded event: %s", msg.Payload))
	}
	tx, ok := pgtx.TxFromContext(msg.Context())
	if !ok {
		return fmt.Errorf("rewards: no transaction in the message context")
	}
	cashback := ev.AmountPaise * 2 / 100 // 2%, in integer paise: no floating point near money
	res, err := tx.ExecContext(msg.Context(), `INSERT INTO `+pgtx.QualifiedName(r.schema, "cashback_credits")+` (payment_id, event_id, amount_paise)
VALUES ($1, $2, $3) ON CONFLICT (payment_id) DO NOTHING`, ev.PaymentID, msg.UUID, cashback)
	if err != nil {
		return err
	}
	k, _ := res.RowsAffected()
	r.credited.Store(msg.Metadata.Get(metadataDelivery), k > 0)
	if k == 0 {
		// A second, different event id for the same payment: the business key holds the line.
		r.n.say("rewards: %s was already credited under another event id; nothing to do", ev.PaymentID)
		return nil
	}
	payload, _ := json.Marshal(cashbackCredited{Type: "CashbackCredited", PaymentID: ev.PaymentID, AmountPaise: cashback, Phone: ev.Phone})
	out := message.NewMessage("cashback-"+ev.PaymentID, payload)
	out.Metadata.Set("partition_key", ev.PaymentID)
	out.Metadata.Set("event_type", "CashbackCredited")
	out.SetContext(msg.Context()) // the outbox publisher joins the handler's transaction
	return r.outbox.Publish(r.cashback, out)
}

// observe narrates each delivery and how it ended, and counts deliveries.
func (r *rewardsService) observe(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		k := r.deliveries.Add(1)
		id := strconv.FormatInt(k, 10)
		msg.Metadata.Set(metadataDelivery, id)
		out, err := h(msg)
		credited, ran := r.credited.LoadAndDelete(id)
		where := transport(msg)
		switch {
		case err != nil:
			r.n.say("rewards: delivery #%d of %s (%s) FAILED, rolled back, will be redelivered: %v", k, msg.UUID, where, err)
		case ran && credited.(bool):
			r.n.step("rewards: delivery #%d of %s (%s) -> APPLIED: credited 2%% cashback %s (2400 paise) and stored CashbackCredited in the rewards outbox, one transaction with the dedupe claim", k, msg.UUID, where, rupees(2400))
		case ran:
			r.n.step("rewards: delivery #%d of %s (%s) -> APPLIED its claim; the payment was credited under another event id, so nothing else", k, msg.UUID, where)
		default:
			r.n.step("rewards: delivery #%d of %s (%s) -> DUPLICATE absorbed: (rewards, %s) already claimed; nothing applied, acked", k, msg.UUID, where, msg.UUID)
		}
		return out, err
	}
}

// notificationsService records an SMS intent per CashbackCredited in the handler's transaction
// and sends it later, with an idempotency key the provider honours.
//
// Issue 6's intent package (record intent + fenced sender) and idemkey (derived keys, an
// Idempotency-Key RoundTripper) generalise this; the demo keeps its own few lines so that every
// step is visible here.
type notificationsService struct {
	router   *message.Router
	db       *sql.DB
	schema   string
	provider *fakeSMSProvider
	n        narrator
	attempts int
}

func newNotifications(db *sql.DB, b *broker.Broker, schema, inTopic string, provider *fakeSMSProvider, n narrator, logger watermill.LoggerAdapter) (*notificationsService, error) {
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "notifications"}, logger)
	if err != nil {
		return nil, err
	}
	s := &notificationsService{db: db, schema: schema, provider: provider, n: n}
	pass := func(h message.HandlerFunc) message.HandlerFunc { return h }
	if s.router, err = consumerRouter(b, "notifications", inTopic, mw, pass, s.handle, logger); err != nil {
		return nil, err
	}
	return s, nil
}

// idempotencyKey derives the downstream key from (consumer, event id, step): the same for every
// copy of the event, different for every consumer and every external call.
func idempotencyKey(consumer, eventID, step string) string {
	sum := sha256.Sum256([]byte(consumer + "\x00" + eventID + "\x00" + step))
	return hex.EncodeToString(sum[:])
}

func (s *notificationsService) handle(msg *message.Message) error {
	var ev cashbackCredited
	if err := json.Unmarshal(msg.Payload, &ev); err != nil || ev.PaymentID == "" {
		return wmonce.Permanent(fmt.Errorf("not a CashbackCredited event: %s", msg.Payload))
	}
	tx, ok := pgtx.TxFromContext(msg.Context())
	if !ok {
		return fmt.Errorf("notifications: no transaction in the message context")
	}
	key := idempotencyKey("notifications", msg.UUID, "sms")
	body := fmt.Sprintf("You earned %s cashback on payment %s.", rupees(ev.AmountPaise), ev.PaymentID)
	if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+pgtx.QualifiedName(s.schema, "sms_intents")+` (idempotency_key, event_id, phone, body)
VALUES ($1, $2, $3, $4) ON CONFLICT (idempotency_key) DO NOTHING`, key, msg.UUID, ev.Phone, body); err != nil {
		return err
	}
	s.n.step("notifications: %s received; recorded the SMS intent (Idempotency-Key %s…) in the handler's transaction; nothing sent yet", msg.UUID, key[:12])
	return nil
}

// sendLoop sends PENDING intents. The first attempt "crashes" after the provider accepted and
// before the intent is marked SENT; the retry carries the same key and the provider answers
// with its first result instead of sending again.
func (s *notificationsService) sendLoop(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pending, err := s.pending(ctx)
		if err != nil {
			continue
		}
		for _, i := range pending {
			id, replayed, err := s.provider.Send(ctx, i.key, i.phone, i.body)
			if err != nil {
				s.n.say("sender: provider call failed (%v); the intent stays PENDING and is retried", err)
				continue
			}
			s.attempts++
			if s.attempts == 1 {
				s.n.step("sender: provider accepted the SMS (message %s) and the sender CRASHED before marking the intent SENT", id)
				continue
			}
			if _, err := s.db.ExecContext(ctx, `UPDATE `+pgtx.QualifiedName(s.schema, "sms_intents")+` SET status = 'SENT', provider_message_id = $2, sent_at = now()
WHERE idempotency_key = $1 AND status = 'PENDING'`, i.key, id); err != nil {
				continue
			}
			s.n.step("sender: retried with the same Idempotency-Key; provider answered message %s (replayed=%v): no second SMS; intent marked SENT", id, replayed)
		}
	}
}

type smsIntent struct{ key, phone, body string }

// pending reads up to 10 PENDING intents, oldest first.
func (s *notificationsService) pending(ctx context.Context) ([]smsIntent, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT idempotency_key, phone, body FROM `+pgtx.QualifiedName(s.schema, "sms_intents")+` WHERE status = 'PENDING' ORDER BY created_at LIMIT 10`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pending []smsIntent
	for rows.Next() {
		var i smsIntent
		if err := rows.Scan(&i.key, &i.phone, &i.body); err != nil {
			return nil, err
		}
		pending = append(pending, i)
	}
	return pending, rows.Err()
}

func (s *notificationsService) sent(ctx context.Context) int {
	var k int
	_ = s.db.QueryRowContext(ctx, `SELECT count(*) FROM `+pgtx.QualifiedName(s.schema, "sms_intents")+` WHERE status = 'SENT'`).Scan(&k)
	return k
}

// consumerRouter subscribes group to topic with: observe -> once.Stack (retry,
// effectively-once, correlation, recoverer) -> handler.
func consumerRouter(b *broker.Broker, group, topic string, mw *once.Middleware, observe message.HandlerMiddleware, h message.NoPublishHandlerFunc, logger watermill.LoggerAdapter) (*message.Router, error) {
	sub, err := b.NewSubscriber(group)
	if err != nil {
		return nil, err
	}
	stack, err := once.Stack(once.StackConfig{Middleware: mw, Logger: logger})
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return nil, err
	}
	handler := router.AddConsumerHandler(group, topic, sub, h)
	handler.AddMiddleware(append([]message.HandlerMiddleware{observe}, stack...)...)
	return router, nil
}

// transport describes the copy: its transport id and, on Kafka, where the broker stored it.
func transport(msg *message.Message) string {
	s := "transport " + msg.Metadata.Get("transport_id")
	if p, ok := kafka.MessagePartitionFromCtx(msg.Context()); ok {
		off, _ := kafka.MessagePartitionOffsetFromCtx(msg.Context())
		s += fmt.Sprintf(", kafka partition %d offset %d", p, off)
	}
	return s
}
