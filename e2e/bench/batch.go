package main

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// batchVariant prepares B7: B4's middleware with a batch handler that writes B1's business rows
// with one multi-row INSERT per group.
func (h *harness) batchVariant(r *rig, res *Result, consumer string, handler *message.NoPublishHandlerFunc, describe *[]func()) (*once.Middleware, error) {
	cfg := once.Config{Schema: h.opts.schema, Consumer: consumer}
	cfg.GroupCommit = once.GroupCommitConfig{Workers: h.opts.groupWorkers, Linger: h.opts.batchLinger}
	res.Notes = fmt.Sprintf("GroupCommit Workers %d, TxBatchSize 100, Linger %s", cmp.Or(h.opts.groupWorkers, 2), h.opts.batchLinger)
	if r.kind == broker.SQL {
		cfg.DisableSubscriberTxReuse = true // messages in the subscriber's transaction are not grouped
		res.Notes += "; DisableSubscriberTxReuse"
	}
	eo, err := once.New(h.db, cfg, h.logger)
	if err != nil {
		return nil, err
	}
	bh := h.batchInsert()
	*handler = func(msg *message.Message) error {
		_, err := bh(msg)
		return err
	}
	*describe = append(*describe, func() {
		if c := eo.Counters(); c.GroupCommitTransactions > 0 {
			res.Notes += fmt.Sprintf("; avg group %.1f msgs/tx", float64(c.GroupCommitMessages)/float64(c.GroupCommitTransactions))
		}
	})
	return eo, nil
}

// batchInsert is B1's business write as a batch handler: one multi-row INSERT per batch.
func (h *harness) batchInsert() message.HandlerFunc {
	insert := `INSERT INTO ` + pgtx.QualifiedName(h.opts.schema, "bench_effects") + ` (message_id, payload) SELECT * FROM unnest($1::text[], $2::bytea[])`
	return once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		ids := make([]string, len(msgs))
		payloads := make([][]byte, len(msgs))
		for i, m := range msgs {
			ids[i], payloads[i] = m.UUID, m.Payload
		}
		_, err := tx.ExecContext(ctx, insert, ids, payloads)
		return nil, err
	})
}
