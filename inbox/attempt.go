package inbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/lend"
	iworker "github.com/wmonce/watermill-once/internal/worker"
)

// runHandler builds the message of r, runs the handler with tx in its context and stores the
// messages it returns in the outbox within tx (internal/lend). Whether the handler ended tx is
// checked after a failure, and after every handler when tx holds other rows too (shared): a
// neighbour must not take the blame. Alone, a handler that returned no error and ended tx is
// found out by the next statement (the output store, the caller's completion or guard Close).
func (p *Processor) runHandler(ctx context.Context, tx *sql.Tx, r claimedRow, shared bool) (err error) {
	msg := message.NewMessage(r.uuid, r.payload)
	if err := json.Unmarshal([]byte(r.metadata), &msg.Metadata); err != nil {
		return wmonce.Permanent(fmt.Errorf("inbox: row %d: metadata is not a JSON object of strings: %w", r.id, err))
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	ctx, span := p.startSpan(ctx, r, msg)
	defer func() { finishSpan(ctx, span, err) }()
	hctx := contextWithDelivery(ctx, Delivery{
		ID: r.id, Consumer: p.config.Consumer, MessageID: r.messageID, OrderingKey: r.orderingKey,
		Topic: r.topic, Attempt: r.attempts, ReceivedAt: r.receivedAt,
	})
	// The step the effectively-once middleware shares (internal/lend). Keys for effects outside
	// the database (idemkey.ForMessage) follow the inbox's dedupe key.
	outcome, err := p.step.Handle(hctx, tx, p.handler, lend.Delivery{
		Msg: msg, Consumer: p.config.Consumer, Key: r.messageID, OutputTopic: p.config.OutputTopic, Shared: shared,
		HandlerAcked: &p.handlerAcked,
	})
	if outcome == lend.EndedTx {
		return p.handlerEndedTx(r, err)
	}
	return err
}

// backoff is the delay after the given failed attempt (1-based): doubling from Backoff, capped
// at MaxBackoff, drawn uniformly from its upper half.
func (p *Processor) backoff(attempt int) time.Duration {
	return iworker.Delay(p.config.Backoff, p.config.MaxBackoff, attempt)
}

func errorText(err error) string {
	s := strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", ""), "?")
	if len(s) > 4000 {
		s = strings.ToValidUTF8(s[:4000], "") + "..."
	}
	return s
}
