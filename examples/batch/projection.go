package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/middleware/once"
)

// applyTransfers is the projection: every fresh transfer of a group in one statement. The
// middleware has already filtered out copies, so a delta is added once per event.
func applyTransfers(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
	accounts := make([]string, 0, len(msgs))
	cents := make([]int64, 0, len(msgs))
	failed := map[*message.Message]error{}
	for _, msg := range msgs {
		var t struct {
			Account string `json:"account"`
			Cents   int64  `json:"cents"`
		}
		if err := json.Unmarshal(msg.Payload, &t); err != nil || t.Account == "" {
			failed[msg] = wmonce.Permanent(fmt.Errorf("not a transfer: %q", msg.Payload)) // parked by the Stack
			continue
		}
		accounts, cents = append(accounts, t.Account), append(cents, t.Cents)
	}
	if len(failed) > 0 {
		return nil, &once.BatchError{Failed: failed} // the others run again without them
	}
	_, err := tx.ExecContext(ctx, `
INSERT INTO account_balances (account, cents, events)
SELECT account, sum(cents), count(*) FROM unnest($1::text[], $2::bigint[]) AS t(account, cents) GROUP BY account
ON CONFLICT (account) DO UPDATE SET cents = account_balances.cents + excluded.cents,
                                    events = account_balances.events + excluded.events`, accounts, cents)
	return nil, err
}

// runProjection consumes topic into account_balances until ctx ends. db comes from pgtx.Open,
// the schema from migrate; subscriber is any Watermill one.
func runProjection(ctx context.Context, db *sql.DB, topic string, subscriber message.Subscriber, logger watermill.LoggerAdapter) (*once.Middleware, error) {
	// One lane: while it commits a group, the deliveries that arrive meanwhile form the next.
	// A short Linger lets a group fill up when traffic is light.
	mw, err := once.New(db, once.Config{
		Consumer:    "balances",
		GroupCommit: once.GroupCommitConfig{Workers: 1, Linger: 2 * time.Millisecond},
	}, logger)
	if err != nil {
		return nil, err
	}
	stack, err := once.Stack(once.StackConfig{Middleware: mw, Logger: logger})
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(stack...)
	// A plain Watermill handler: the router, the subscriber and the middlewares are Watermill's.
	router.AddHandler("balances", topic, subscriber, "", nil, once.BatchHandler(applyTransfers))
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	return mw, nil
}
