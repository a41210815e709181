package inbox

import (
	"context"
	"database/sql"

	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/pgtx"
)

// runBatches runs, once each, the batch handlers (middleware/once.BatchHandler) whose
// messages a batch's rows handed to c, in tx. An error fails the batch as a whole: its rows
// then run one per transaction, each a batch of one, which finds the row at fault.
func (p *Processor) runBatches(ctx context.Context, tx *sql.Tx, c *lend.Collector) error {
	for _, b := range c.Batches() {
		ds := make([]lend.Delivery, len(b.Items))
		for i, it := range b.Items {
			r := it.Delivery.(*claimedRow)
			ds[i] = lend.Delivery{Msg: it.Msg, Consumer: p.config.Consumer, Key: r.messageID, OutputTopic: p.config.OutputTopic, HandlerAcked: &p.handlerAcked}
		}
		if err := p.step.RunBatch(pgtx.ContextWithTx(ctx, tx), tx, b, ds); err != nil {
			return err
		}
	}
	return nil
}
