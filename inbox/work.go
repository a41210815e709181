package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/lend"
	iworker "github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// claimedRow is one row returned by a claim.
type claimedRow struct {
	id          int64
	messageID   string
	uuid        string
	orderingKey string
	topic       string
	payload     []byte
	metadata    string
	attempts    int // the attempt being started, 1-based
	receivedAt  time.Time

	// ClaimLock only: the number of an earlier attempt that ended its connection or process
	// (0: none), and the row version the attempt starts from (xmin).
	crashed int
	xmin    string
}

// claimBackoff is the wait of a worker after a failed claim (and of the listener after a lost
// connection): database trouble, not the message's doing, so not ProcessorConfig.Backoff.
var claimBackoff = iworker.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}

// claimFailed counts and logs a failed claim and waits claimBackoff; false means ctx ended.
func (p *Processor) claimFailed(ctx context.Context, backoff *iworker.Backoff, err error) bool {
	p.errs.Add(1)
	wait := backoff.Next()
	p.logger.Error("Inbox claim failed, retrying", err, watermill.LogFields{"backoff": wait})
	return iworker.Sleep(ctx, wait)
}

func (p *Processor) work(ctx context.Context, w *worker) {
	backoff := claimBackoff
	for ctx.Err() == nil {
		err := p.requireGuard(ctx)
		var rows []claimedRow
		var token int64
		if err == nil {
			rows, token, err = p.claim(ctx)
		}
		if err != nil {
			if ctx.Err() != nil || !p.claimFailed(ctx, &backoff, err) {
				return
			}
			continue
		}
		backoff.Reset()
		if len(rows) == 0 {
			p.idle(ctx)
			continue
		}
		p.processClaim(ctx, w, rows, token)
	}
}

func (p *Processor) idle(ctx context.Context) {
	t := time.NewTimer(iworker.Jitter(p.config.PollInterval))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-p.wake:
	case <-t.C:
	}
}

// wakeAll tells idle workers to claim now.
func (p *Processor) wakeAll() {
	for range p.config.Workers {
		select {
		case p.wake <- struct{}{}:
		default:
			return
		}
	}
}

// claim takes up to BatchSize due rows under a new token. The statement is not cancelled with
// ctx: rows claimed by a statement whose reply is lost would wait for their lease to expire.
func (p *Processor) claim(ctx context.Context) ([]claimedRow, int64, error) {
	if ctx.Err() != nil {
		return nil, 0, ctx.Err()
	}
	token := newToken()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.config.Lease)
	defer cancel()
	after := p.claimAfter()
	for {
		rows, err := p.claimAbove(qctx, token, after)
		if err != nil {
			return nil, 0, err
		}
		if len(rows) == 0 && after > 0 {
			after = p.rescan() // nothing above the floor: look below it before going idle
			continue
		}
		p.raiseFloor(rows)
		p.claimed.Add(uint64(len(rows)))
		return rows, token, nil
	}
}

func (p *Processor) claimAbove(ctx context.Context, token, after int64) ([]claimedRow, error) {
	rows, err := p.queryClaimed(ctx, p.db, p.q.claim, p.config.Consumer, p.config.BatchSize, token, micros(p.config.Lease), after)
	if err != nil {
		return nil, err
	}
	// UPDATE ... RETURNING yields rows in no particular order.
	slices.SortFunc(rows, func(a, b claimedRow) int { return cmp.Compare(a.id, b.id) })
	return rows, nil
}

// rescanEvery bounds how long a row below the claim floor can wait to be seen.
const rescanEvery = 100 * time.Millisecond

// claimAfter returns the id claims start above. Finished rows are not removed from the
// indexes until VACUUM, so a claim that starts at the beginning of the table walks past every
// row finished since: draining a backlog that way costs time quadratic in its size. Claims
// therefore start above a floor: the smallest id the last claim took, less one. Everything
// below it was, when that claim looked, finished, claimed by another worker, not yet due or
// held back by its ordering key. Such rows can become claimable later (a retry falls due, a
// key's older row finishes, a claim is released or reaped, an operator replays a row), so
// every rescanEvery, and whenever a claim above the floor finds nothing, a claim starts from
// the beginning instead: a row below the floor waits at most rescanEvery longer.
func (p *Processor) claimAfter() int64 {
	now := time.Now().UnixNano()
	if last := p.lastRescan.Load(); now-last >= int64(rescanEvery) && p.lastRescan.CompareAndSwap(last, now) {
		return 0
	}
	return p.floor.Load()
}

// rescan makes the next claims start from the beginning.
func (p *Processor) rescan() int64 {
	p.floor.Store(0)
	p.lastRescan.Store(time.Now().UnixNano())
	return 0
}

// raiseFloor records the smallest id of a claim (rows in id order) as the new floor.
func (p *Processor) raiseFloor(rows []claimedRow) {
	if len(rows) == 0 {
		return
	}
	next := rows[0].id - 1
	for {
		cur := p.floor.Load()
		if next <= cur || p.floor.CompareAndSwap(cur, next) {
			return
		}
	}
}

func newToken() int64 {
	for {
		if t := rand.Int64(); t != 0 {
			return t
		}
	}
}

// processClaim works through one claim in TxBatchSize chunks. Once claiming stops (shutdown),
// rows not yet started are released at once.
//
// A row whose last attempt lost its lease (r.crashed: the worker died, stalled or was killed)
// may kill this worker too. It runs alone, and the rest of the claim is given back first: the
// lease of a dead worker's claim expires for every row in it, started or not, so a crash
// would otherwise count an attempt against each of its neighbours every time, and park them
// with it.
func (p *Processor) processClaim(ctx context.Context, w *worker, rows []claimedRow, token int64) {
	w.own(rows, token)
	for i := 0; i < len(rows); {
		if ctx.Err() != nil {
			p.releaseUnstarted(w)
			return
		}
		end := i + 1
		if rows[i].crashed > 0 {
			p.releaseUnstarted(w, rows[i].id)
		} else {
			for end < len(rows) && end-i < p.config.TxBatchSize && rows[end].crashed == 0 {
				end++
			}
		}
		chunk := w.begin(rows[i:end])
		i = end
		switch len(chunk) {
		case 0:
			continue
		case 1:
			p.processOne(w, chunk[0], token)
		default:
			p.processBatch(w, chunk, token)
		}
	}
}

// releaseUnstarted gives back the rows a worker claimed but has not started, except keep.
func (p *Processor) releaseUnstarted(w *worker, keep ...int64) {
	if rowIDs, tokens := w.takeUnstarted(keep...); len(rowIDs) > 0 {
		p.releasePairs(rowIDs, tokens, 0)
	}
}

func ids(rows []claimedRow) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.id
	}
	return out
}

// outcome of one processing transaction.
type outcome int

const (
	outcomeDone     outcome = iota
	outcomeFailed           // handler failed: record the attempt
	outcomeConflict         // the claim was lost: nothing to record
	outcomeRetryTx          // serialization failure or deadlock: run the transaction again
	outcomeRelease          // not the message's fault (shutdown, no transaction): give the row back
	outcomeCounted          // a batch's commit failed after its handlers ran: count every row's attempt
)

// processOne runs one row in a transaction of its own and settles it.
func (p *Processor) processOne(w *worker, r claimedRow, token int64) {
	defer w.settle(r.id)
	var res outcome
	var err error
	_ = pgtx.Retry(p.handlerCtx(), pgtx.RetryPolicy{}, func(context.Context, int) error {
		res, err = p.attemptOne(w, r, token)
		if res == outcomeRetryTx {
			return err // a serialization failure or deadlock: run the transaction again
		}
		return nil
	})
	switch {
	case res == outcomeRetryTx && p.handlerCtx().Err() != nil:
		res, err = outcomeRelease, fmt.Errorf("shutdown: %w", err) // the wait was cut short
	case res == outcomeRetryTx:
		res = outcomeFailed
	}
	p.settle(r, token, res, err)
}

// attemptTx is the transaction of one processing attempt.
type attemptTx struct {
	*sql.Tx   // nil when BEGIN failed
	w         *worker
	cancel    context.CancelFunc
	spans     *txSpans // the attempts' spans, ended after the COMMIT they record
	committed bool
}

// beginAttempt starts an attempt's transaction, bounded by HandlerTimeout and marked on w so
// that lease renewal knows a transaction is running, and opens the attempt guard in it (see
// guard.go; on a pool from pgtx.Open it travels with the first statement). Defer the attempt's
// end, also after an error.
func (p *Processor) beginAttempt(w *worker) (context.Context, *attemptTx, error) {
	ctx, cancel := context.WithTimeout(p.handlerCtx(), p.config.HandlerTimeout)
	ctx, spans := withTxSpans(ctx)
	w.beginTx()
	tx, err := p.db.BeginTx(ctx, p.config.TxOptions)
	if err == nil {
		err = p.guard.Open(ctx, tx)
	}
	return ctx, &attemptTx{Tx: tx, w: w, cancel: cancel, spans: spans}, err
}

// end rolls the transaction back unless it was committed, and ends the attempt.
func (a *attemptTx) end() {
	if a.Tx != nil && !a.committed {
		_ = a.Rollback()
	}
	a.spans.end("not committed")
	a.w.endTx()
	a.cancel()
}

// commit ends the attempt's transaction with COMMIT.
func (a *attemptTx) commit() error {
	a.committed = true
	err := a.Commit()
	a.spans.committed(err)
	return err
}

func (p *Processor) attemptOne(w *worker, r claimedRow, token int64) (outcome, error) {
	ctx, tx, err := p.beginAttempt(w)
	defer tx.end()
	if err != nil {
		return outcomeRelease, fmt.Errorf("inbox: begin: %w", err)
	}
	if err := p.runHandler(ctx, tx.Tx, r, false); err != nil {
		return p.classifyHandler(ctx, err)
	}
	res, err := tx.ExecContext(ctx, p.q.complete, r.id, token)
	if ended := p.endedAt(ctx, r, err); ended != nil {
		return outcomeFailed, ended // the handler ended the transaction and returned no error
	}
	if err != nil {
		return p.classifyHandler(ctx, fmt.Errorf("inbox: mark done: %w", err))
	}
	if n, _ := res.RowsAffected(); n == 0 {
		tx.spans.end("lease lost: rolled back")
		return outcomeConflict, nil
	}
	if err := p.guard.Close(ctx, tx.Tx); err != nil {
		if ended := p.endedAt(ctx, r, err); ended != nil {
			return outcomeFailed, ended
		}
		return p.classifyHandler(ctx, fmt.Errorf("inbox: %w", err))
	}
	if err := tx.commit(); err != nil {
		// The handler ran, so the attempt counts (a message whose effects kill the backend at
		// commit must not loop). The outcome of a failed COMMIT may be unknown; recording the
		// failure is fenced, so if the commit did happen it changes nothing.
		return outcomeFailed, fmt.Errorf("inbox: commit: %w", err)
	}
	tx.spans.end("")
	return outcomeDone, nil
}

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
	})
	if outcome == lend.EndedTx {
		return p.handlerEndedTx(r, err)
	}
	return err
}

// classifyHandler decides what a failure inside the processing transaction means.
func (p *Processor) classifyHandler(ctx context.Context, err error) (outcome, error) {
	switch {
	case isEnded(err):
		return outcomeFailed, err // permanent: the row is parked
	case p.handlerCtx().Err() != nil:
		return outcomeRelease, fmt.Errorf("shutdown: %w", err)
	case pgtx.IsRetryableTx(err):
		return outcomeRetryTx, err
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return outcomeFailed, fmt.Errorf("handler exceeded HandlerTimeout (%s): %w", p.config.HandlerTimeout, err)
	case pgtx.IsConnectionError(err):
		// The connection ended while the handler ran. A message can do that to its own
		// backend (a query that crashes it, pg_terminate_backend, an out-of-memory kill), and
		// from here it cannot be told apart from a server restart: the attempt counts, so a
		// message that kills its backend every time is parked after MaxAttempts. A restart
		// costs each row in work one attempt.
		return outcomeFailed, fmt.Errorf("inbox: the database connection ended during the attempt (counted): %w", err)
	}
	return outcomeFailed, err
}

// releaseDelay is how long a row given back unprocessed waits: not at all at shutdown (another
// instance may take it at once), Backoff after database trouble.
func (p *Processor) releaseDelay() time.Duration {
	if p.handlerCtx().Err() != nil {
		return 0
	}
	return p.config.Backoff
}

// settle records the result of a row's processing.
func (p *Processor) settle(r claimedRow, token int64, res outcome, err error) {
	fields := watermill.LogFields{"row": r.id, "message_id": r.messageID, "attempt": r.attempts}
	switch res {
	case outcomeDone:
		p.processed.Add(1)
	case outcomeConflict:
		p.conflicts.Add(1)
		p.logger.Info("Lease lost before completion: rolled back, another worker owns the row", fields)
	case outcomeRelease:
		if p.handlerCtx().Err() != nil {
			p.logger.Info("Shutdown: row given back unprocessed", fields)
		} else {
			p.errs.Add(1)
			p.logger.Error("Row not processed; giving it back", err, fields)
		}
		p.release([]claimedRow{r}, token, p.releaseDelay())
	case outcomeFailed, outcomeRetryTx:
		p.recordFailure(r, token, err)
	}
}

// recordFailure counts a failed attempt: back to PENDING after a backoff, or parked as FAILED
// past the limit or for a permanent error. Fenced by the token like every change.
func (p *Processor) recordFailure(r claimedRow, token int64, cause error) {
	fields := watermill.LogFields{"row": r.id, "message_id": r.messageID, "attempt": r.attempts, "max_attempts": p.config.MaxAttempts}
	delay := p.backoff(r.attempts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var status string
	err := p.db.QueryRowContext(ctx, p.q.fail, r.id, token, wmonce.IsPermanent(cause), p.config.MaxAttempts, micros(delay), errorText(cause)).Scan(&status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		p.conflicts.Add(1)
		p.logger.Info("Attempt failed after its claim was gone (lease lost to another worker, or a COMMIT whose reply was lost did commit)", fields.Add(watermill.LogFields{"err": cause.Error()}))
	case err != nil:
		p.failed.Add(1)
		p.errs.Add(1)
		p.logger.Error("Could not record a failed attempt; the row is retried when its lease expires", errors.Join(cause, err), fields)
	case Status(status) == StatusFailed:
		p.failed.Add(1)
		p.parked.Add(1)
		p.logger.Error("Row parked as FAILED: replay or skip it (its ordering key, if any, waits)", cause, fields)
	default:
		p.failed.Add(1)
		p.logger.Info("Attempt failed; retrying later", fields.Add(watermill.LogFields{"err": cause.Error(), "retry_in": delay}))
	}
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

// processBatch runs several rows in one transaction and completes them with one statement.
// Any failure rolls everything back and falls back to one transaction per row. A row whose
// handler ended the transaction is parked at once, and the others run again one per
// transaction: the attempt guard refused any COMMIT the handler sent, so their first run left
// nothing behind.
func (p *Processor) processBatch(w *worker, rows []claimedRow, token int64) {
	b := p.attemptBatch(w, rows, token)
	switch b.res {
	case outcomeDone:
		p.processed.Add(uint64(len(rows)))
		w.settle(ids(rows)...)
		return
	case outcomeRelease:
		if p.handlerCtx().Err() == nil {
			p.errs.Add(1)
		}
		p.release(rows, token, p.releaseDelay())
		w.settle(ids(rows)...)
		return
	case outcomeCounted:
		// The handlers ran but the commit failed: every row's attempt counts (fenced: rows the
		// commit did complete are left alone).
		for _, r := range rows {
			p.recordFailure(r, token, b.err)
			w.settle(r.id)
		}
		return
	}
	if b.endedBy != nil {
		p.recordFailure(*b.endedBy, token, b.err)
		w.settle(b.endedBy.id)
	}
	for _, r := range rows {
		switch {
		case b.endedBy != nil && r.id == b.endedBy.id:
		case b.lost[r.id]:
			p.conflicts.Add(1)
			p.logger.Info("Lease lost before completion: rolled back, another worker owns the row", watermill.LogFields{"row": r.id})
			w.settle(r.id)
		default:
			p.processOne(w, r, token)
		}
	}
}

// batchResult is how a batch's transaction ended: outcomeDone, outcomeRelease (begin failed or
// shutdown: give the rows back), outcomeCounted (commit failed after the handlers ran; err says
// why) or outcomeFailed (fall back to one row per transaction, skipping the lost rows and
// parking endedBy with err).
type batchResult struct {
	res     outcome
	lost    map[int64]bool
	endedBy *claimedRow // the row whose handler ended the transaction, if one did
	err     error
}

func (p *Processor) attemptBatch(w *worker, rows []claimedRow, token int64) batchResult {
	ctx, tx, err := p.beginAttempt(w)
	defer tx.end()
	if err != nil {
		p.logger.Error("Batch begin failed; giving its rows back", err, watermill.LogFields{"rows": len(rows)})
		return batchResult{res: outcomeRelease}
	}
	for _, r := range rows {
		if err := p.runHandler(ctx, tx.Tx, r, true); err != nil {
			if isEnded(err) {
				return batchResult{res: outcomeFailed, endedBy: &r, err: err}
			}
			if p.handlerCtx().Err() != nil {
				return batchResult{res: outcomeRelease}
			}
			p.logger.Debug("Handler failed in a batch; processing the batch row by row", watermill.LogFields{"row": r.id, "err": err.Error()})
			return batchResult{res: outcomeFailed}
		}
	}
	done, err := tx.ExecContext(ctx, p.q.completeMany, ids(rows), token)
	if err != nil {
		return batchResult{res: outcomeFailed}
	}
	if n, _ := done.RowsAffected(); int(n) != len(rows) {
		_ = tx.Rollback()
		return batchResult{res: outcomeFailed, lost: p.lostRows(rows, token)}
	}
	if err := p.guard.Close(ctx, tx.Tx); err != nil {
		return batchResult{res: outcomeFailed}
	}
	if err := tx.commit(); err != nil {
		p.logger.Error("Batch commit failed; counting an attempt for each of its rows", err, watermill.LogFields{"rows": len(rows)})
		return batchResult{res: outcomeCounted, err: fmt.Errorf("inbox: batch commit: %w", err)}
	}
	tx.spans.end("")
	return batchResult{res: outcomeDone}
}

// lostRows returns the rows of a batch whose claim is no longer ours.
func (p *Processor) lostRows(rows []claimedRow, token int64) map[int64]bool {
	lost := allLost(rows)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := p.db.QueryContext(ctx, p.q.owned, ids(rows), token)
	if err != nil {
		return nil // let the one-by-one path find out, fenced as always
	}
	defer rs.Close()
	for rs.Next() {
		var id int64
		if rs.Scan(&id) == nil {
			delete(lost, id)
		}
	}
	if rs.Err() != nil {
		return nil
	}
	return lost
}

func allLost(rows []claimedRow) map[int64]bool {
	m := make(map[int64]bool, len(rows))
	for _, r := range rows {
		m[r.id] = true
	}
	return m
}

// release gives claimed rows back (PENDING, attempt not counted, due after delay), fenced by
// token.
func (p *Processor) release(rows []claimedRow, token int64, delay time.Duration) {
	if len(rows) == 0 {
		return
	}
	tokens := make([]int64, len(rows))
	for i := range tokens {
		tokens[i] = token
	}
	p.releasePairs(ids(rows), tokens, delay)
}

func (p *Processor) releasePairs(rowIDs, tokens []int64, delay time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := p.db.ExecContext(ctx, p.q.release, rowIDs, tokens, micros(delay))
	if err != nil {
		p.errs.Add(1)
		p.logger.Error("Could not release claimed rows; they return when their lease expires", err, watermill.LogFields{"rows": len(rowIDs)})
		return
	}
	n, _ := res.RowsAffected()
	p.released.Add(uint64(n))
}

// releaseAllOwned gives back whatever any worker still holds: rows of handlers that ignored
// cancellation at shutdown. Their late completion is refused by the token.
func (p *Processor) releaseAllOwned() {
	var rowIDs, tokens []int64
	for _, w := range p.workers {
		w.mu.Lock()
		for id, token := range w.owned {
			rowIDs = append(rowIDs, id)
			tokens = append(tokens, token)
		}
		w.mu.Unlock()
	}
	if len(rowIDs) > 0 {
		p.releasePairs(rowIDs, tokens, 0)
	}
}
