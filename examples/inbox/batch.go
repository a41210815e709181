package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

const accounts = 20 // the run's payments are spread over this many accounts

// payment is the PaymentCaptured event.
type payment struct {
	PaymentID   string `json:"payment_id"`
	Account     string `json:"account"`
	Seq         int    `json:"seq"` // per-account sequence, to check the processing order
	AmountPaise int64  `json:"amount_paise"`
}

// batch is what run publishes: each payment once, every tenth a second time under a new UUID
// (a retrying producer), then one undecodable event and one without a payment id.
type batch struct {
	msgs          []*message.Message
	payments      int    // distinct valid events
	copies        int    // extra copies
	brokenID      string // payment id of the undecodable event
	brokenAccount string // its account (its ordering key)
	anonymousUUID string // the event without a payment id
	start         time.Time
	took          time.Duration // publishing
}

func newBatch(runID string, events int) *batch {
	b := &batch{payments: events, brokenID: runID + "-pay-broken", brokenAccount: runID + "-acct-broken"}
	seqs := map[string]int{}
	for i := range events {
		acct := fmt.Sprintf("%s-acct-%d", runID, i%accounts)
		seqs[acct]++
		p := payment{PaymentID: fmt.Sprintf("%s-pay-%d", runID, i), Account: acct, Seq: seqs[acct], AmountPaise: int64(1000 + i)}
		b.msgs = append(b.msgs, paymentMessage(p))
		if i%10 == 0 {
			b.msgs = append(b.msgs, paymentMessage(p))
			b.copies++
		}
	}
	broken := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id": "truncated`))
	broken.Metadata.Set("payment_id", b.brokenID)
	broken.Metadata.Set("account", b.brokenAccount)
	broken.Metadata.Set("partition_key", b.brokenAccount)
	anonymous := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	anonymous.Metadata.Set("account", runID+"-acct-0")
	anonymous.Metadata.Set("partition_key", runID+"-acct-0")
	b.anonymousUUID = anonymous.UUID
	b.msgs = append(b.msgs, broken, anonymous)
	return b
}

// publish sends the batch one message at a time: that keeps each account's order on every broker.
func (b *batch) publish(pub message.Publisher, topic string) error {
	b.start = time.Now()
	for _, m := range b.msgs {
		if err := pub.Publish(topic, m); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	b.took = time.Since(b.start)
	return nil
}

func paymentMessage(p payment) *message.Message {
	body, _ := json.Marshal(p)
	m := message.NewMessage(watermill.NewUUID(), body)
	m.Metadata.Set("payment_id", p.PaymentID)
	m.Metadata.Set("account", p.Account)
	m.Metadata.Set("partition_key", p.Account) // Kafka: one account, one partition, in order
	return m
}
