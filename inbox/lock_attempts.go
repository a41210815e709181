package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/pgtx"
)

func attemptsOf(rows []claimedRow) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = int64(r.attempts)
	}
	return out
}

// startTimeout bounds recording or withdrawing the start of an attempt.
const startTimeout = 10 * time.Second

// startLocked commits the start of the attempts on rows, on a connection of its own (the row
// locks do not cover inbox_attempts), before any handler runs: if the attempt then ends the
// connection or the process, the start stays and the next worker to lock the row counts it.
// It costs one round trip and one commit per transaction, and briefly a second connection.
//
// The statement is not cut off at HandlerTimeout: the database may commit a statement whose
// caller gave up on it (pgx stops waiting, the server does not stop), and a start committed
// that way, with no handler run, would be taken for an attempt that killed its process. If
// recording fails all the same, the start is withdrawn before the error is returned.
func (p *Processor) startLocked(rows []claimedRow) error {
	xmins := make([]string, len(rows))
	for i, r := range rows {
		xmins[i] = r.xmin
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if _, err := p.db.ExecContext(ctx, p.q.startLock, ids(rows), attemptsOf(rows), xmins); err != nil {
		if pgtx.IsUndefinedTable(err) {
			return fmt.Errorf("inbox: table inbox_attempts is missing: run the migrations (007): %w", err)
		}
		p.forgetLocked(rows)
		return fmt.Errorf("inbox: record the start of an attempt: %w", err)
	}
	return nil
}

// forgetLocked withdraws the starts of attempts that do not count (shutdown, a batch falling
// back to one row per transaction, a start that could not be recorded). Only starts with
// these attempt numbers are removed. After the locks are gone another worker may have locked
// the same row version and started the same attempt number: its start is removed too, so if
// that attempt then kills its process, it is not counted (the row gets one more run). If
// forgetting fails, the attempts are counted after all.
func (p *Processor) forgetLocked(rows []claimedRow) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if _, err := p.db.ExecContext(ctx, p.q.forgetLock, ids(rows), attemptsOf(rows)); err != nil {
		p.errs.Add(1)
		p.logger.Error("Could not withdraw the start of attempts that did not happen; they will be counted", err, watermill.LogFields{"rows": len(rows)})
	}
}
