package inbox

import (
	"context"
	"database/sql"

	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/pgtx"
)

// runBatches runs, once each, the batch handlers (middleware/once.BatchHandler) whose
// messages a batch's rows handed to c, in tx. An error fails the batch as a whole: its rows
// then run one per transaction, each a batch of one, which finds the row at fault.
func (p *Processor) runBatches(ctx context.Context, tx *sql.Tx, c *lend.Collector) error {
	for _, b := range c.Batches() {
		if err := p.runBatch(ctx, tx, b); err != nil {
			return err
		}
	}
	return nil
}

// runBatch runs b in tx under a span linked to each row's consumer span, as the middleware
// does: a row's message carries its span in its context (runHandler).
func (p *Processor) runBatch(ctx context.Context, tx *sql.Tx, b *lend.Batch) (err error) {
	ds := make([]lend.Delivery, len(b.Items))
	links := make([]trace.Link, 0, len(b.Items))
	for i, it := range b.Items {
		r := it.Delivery.(*claimedRow)
		ds[i] = lend.Delivery{Msg: it.Msg, Consumer: p.config.Consumer, Key: r.messageID, OutputTopic: p.config.OutputTopic, HandlerAcked: &p.handlerAcked}
		if sc := trace.SpanContextFromContext(it.Msg.Context()); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := p.tracer.Start(pgtx.ContextWithTx(ctx, tx), tracing.SpanBatch, trace.WithLinks(links...),
		trace.WithAttributes(tracing.Consumer.String(p.config.Consumer), tracing.BatchSize.Int(len(b.Items))))
	defer func() { tracing.End(span, err) }()
	return p.step.RunBatch(ctx, tx, b, ds)
}
