package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/wmonce/watermill-once/middleware"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// ErrOutputWithoutTopic is returned (as a permanent error, so the row is parked) when the
// handler returns messages but ProcessorConfig.OutputTopic is empty.
var ErrOutputWithoutTopic = errors.New("handler returned messages but ProcessorConfig.OutputTopic is empty: set it, or publish through outbox.Writer.Publisher() with the message context")

// ProcessorConfig configures a Processor.
type ProcessorConfig struct {
	// Schema holds the inbox and outbox tables. Default pgtx.DefaultSchema.
	Schema string
	// Consumer whose rows this processor works: the ReceiverConfig.Consumer. Required.
	Consumer string

	// Workers process rows concurrently, each in its own transactions. Default 4. The pool
	// needs Workers connections plus up to three more (LISTEN, lease upkeep, operations).
	Workers int
	// ClaimBatch is the most rows a worker claims at once. Default 16. Without lease renewal
	// the whole claimed batch must be processed within Lease.
	ClaimBatch int
	// TxBatchSize > 1 processes that many claimed rows in one transaction and completes them
	// with one statement. If any handler in the batch fails, or a lease was lost, the whole
	// transaction is rolled back and its rows are processed again one per transaction, so
	// handlers must not mind running more than once without effect (their database writes are
	// rolled back; effects outside the database are not). Default 1.
	TxBatchSize int

	// Lease is how long a claim stays valid without renewal. After it, another worker may
	// take the row, and the first worker can no longer complete it. Default 30s.
	Lease time.Duration
	// RenewInterval is how often a worker extends the leases it still holds. Default Lease/3.
	// Negative: never renew (fixed leases: a claim must finish within Lease).
	RenewInterval time.Duration
	// HandlerTimeout bounds one processing transaction (one row, or one TxBatchSize batch).
	// Past it the handler's context is cancelled, its transaction rolled back, the attempt
	// counted as failed, and lease renewal stops so the row can be re-claimed even if the
	// handler ignores its context. Default Lease.
	HandlerTimeout time.Duration
	// ReapInterval is how often expired leases are taken back. Default 1s.
	ReapInterval time.Duration
	// PollInterval is the fallback wait of an idle worker; LISTEN/NOTIFY wakes it earlier when
	// rows arrive. Default 1s.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY off: idle workers then only poll. LISTEN is also off
	// when the *sql.DB does not use pgx's stdlib driver.
	DisableListen bool

	// MaxAttempts parks a row as FAILED after this many attempts. Default 10.
	MaxAttempts int
	// Backoff is the delay after the first failed attempt; it doubles per attempt up to
	// MaxBackoff, and each delay is drawn between half and all of that value (jitter).
	// Defaults 1s and 5m.
	Backoff    time.Duration
	MaxBackoff time.Duration

	// ShutdownGrace is how long Close lets handlers that are already running finish. After it
	// their contexts and transactions are cancelled; handlers that still do not return within
	// another ShutdownGrace (at most 5s) are abandoned, and every row still claimed is released.
	// Default 10s; negative: cancel at once.
	ShutdownGrace time.Duration

	// OutputTopic receives the messages the handler returns (through the outbox, in the
	// handler's transaction). Empty: returning messages is a permanent error.
	OutputTopic string
	// Outbox stores returned messages. Default: a Writer on Schema.
	Outbox *outbox.Writer
	// TxOptions of the processing transactions. Default READ COMMITTED.
	TxOptions *sql.TxOptions
}

func (c *ProcessorConfig) setDefaults() {
	if c.Schema == "" {
		c.Schema = pgtx.DefaultSchema
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.ClaimBatch == 0 {
		c.ClaimBatch = 16
	}
	if c.TxBatchSize == 0 {
		c.TxBatchSize = 1
	}
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.Lease / 3
	}
	if c.HandlerTimeout == 0 {
		c.HandlerTimeout = c.Lease
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = time.Second
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.Backoff == 0 {
		c.Backoff = time.Second
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Minute
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.TxOptions == nil {
		c.TxOptions = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
}

// Validate reports what to fix in a configuration.
func (c ProcessorConfig) Validate() error {
	var errs []error
	if err := pgtx.ValidateIdentifier("schema", c.Schema); err != nil {
		errs = append(errs, err)
	}
	if err := validateConsumer(c.Consumer); err != nil {
		errs = append(errs, err)
	}
	if c.Workers < 1 || c.Workers > 1024 {
		errs = append(errs, fmt.Errorf("Workers must be between 1 and 1024, got %d", c.Workers))
	}
	if c.ClaimBatch < 1 || c.ClaimBatch > MaxBatchLimit {
		errs = append(errs, fmt.Errorf("ClaimBatch must be between 1 and %d, got %d", MaxBatchLimit, c.ClaimBatch))
	}
	if c.TxBatchSize < 1 || c.TxBatchSize > c.ClaimBatch {
		errs = append(errs, fmt.Errorf("TxBatchSize must be between 1 and ClaimBatch (%d), got %d", c.ClaimBatch, c.TxBatchSize))
	}
	if c.Lease < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("Lease must be at least 10ms, got %s", c.Lease))
	}
	if c.RenewInterval >= c.Lease {
		errs = append(errs, fmt.Errorf("RenewInterval (%s) must be shorter than Lease (%s), or negative to disable renewal", c.RenewInterval, c.Lease))
	}
	if c.HandlerTimeout < 0 || c.ReapInterval < 0 || c.PollInterval < 0 {
		errs = append(errs, errors.New("HandlerTimeout, ReapInterval and PollInterval must not be negative"))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("MaxAttempts must be at least 1, got %d", c.MaxAttempts))
	}
	if c.Backoff < 0 || c.MaxBackoff < c.Backoff {
		errs = append(errs, fmt.Errorf("Backoff (%s) must not be negative and MaxBackoff (%s) not below it", c.Backoff, c.MaxBackoff))
	}
	if c.OutputTopic != "" {
		if err := outbox.DefaultValidateTopic(c.OutputTopic); err != nil {
			errs = append(errs, fmt.Errorf("OutputTopic: %w", err))
		}
	}
	return errors.Join(errs...)
}

// ProcessorCounts are a processor's running totals since it was created.
type ProcessorCounts struct {
	Claimed        uint64 // rows claimed
	Processed      uint64 // rows moved to DONE
	Failed         uint64 // failed attempts: handler error or panic, timeout, output refused
	Parked         uint64 // rows moved to FAILED by this processor (limit, permanent error, expired last lease)
	LeaseConflicts uint64 // changes refused because the claim had been lost to lease expiry
	LeasesExpired  uint64 // expired claims this processor took back (from any worker)
	Released       uint64 // rows given back unprocessed (shutdown, database trouble)
	Errors         uint64 // database errors outside handlers (claim, commit, renewal, reaping)
}

// Processor works through one consumer's inbox rows with a plain Watermill handler.
//
// Guarantees:
//   - Each row is applied at most once: the handler runs in a transaction together with the
//     row's move to DONE and the messages it emits (stored in the outbox, forwarded later by the
//     relay). The move is fenced by the claim token, so a worker whose lease ran out and whose
//     row was claimed again cannot complete it: its transaction, handler effects included, is
//     rolled back and the conflict counted.
//   - Each row is attempted until it is DONE or parked: a failed attempt (error, panic,
//     timeout) is recorded with the error and retried after an exponential backoff with
//     jitter; a permanent error (middleware.Permanent) or the MaxAttempts-th failure parks the
//     row as FAILED, where it waits for Ops.Replay or a skip. A worker that dies mid-attempt
//     leaves a lease that expires; the attempt still counts, so a message that crashes its
//     worker is parked rather than retried forever.
//   - Rows with an ordering key are processed one at a time per key, in received order: a row
//     is eligible only when every older row of its key is DONE or SKIPPED. A failing row
//     holds back its key only; a FAILED row parks its key until replayed or skipped. Rows
//     without a key are processed in parallel.
//
// Limits: effects outside the transaction (HTTP calls, e-mails) are at-least-once: a lost lease
// or a crash before commit runs the handler again. Give such calls an idempotency key derived
// from the Delivery (consumer, message id). Messages the handler emits reach their broker at
// least once, through the outbox relay.
type Processor struct {
	db      *sql.DB
	handler message.HandlerFunc
	config  ProcessorConfig
	logger  watermill.LoggerAdapter
	q       queries
	outbox  *outbox.Writer

	workers []*worker
	wake    chan struct{}

	started  atomic.Bool
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	// handlerCtx is the parent of every processing transaction; cancelled when the shutdown
	// grace runs out.
	handlerCtx     context.Context
	cancelHandlers context.CancelFunc

	claimed, processed, failed, parked, conflicts, expired, released, errs atomic.Uint64
}

// worker is what the lease upkeep and shutdown need to know about one worker.
type worker struct {
	mu      sync.Mutex
	owned   map[int64]int64 // row id -> claim token, for rows claimed and not yet settled
	started map[int64]bool  // owned rows whose processing has begun
	txStart time.Time       // start of the current processing transaction; zero between them
}

func (w *worker) own(rows []claimedRow, token int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range rows {
		w.owned[r.id] = token
	}
}

// begin marks rows as started and returns those still owned: at shutdown, rows not yet
// started may have been taken away and released.
func (w *worker) begin(rows []claimedRow) []claimedRow {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := rows[:0:0]
	for _, r := range rows {
		if _, ok := w.owned[r.id]; ok {
			w.started[r.id] = true
			out = append(out, r)
		}
	}
	return out
}

// takeUnstarted removes and returns the owned rows not started yet.
func (w *worker) takeUnstarted() (rowIDs, tokens []int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, token := range w.owned {
		if !w.started[id] {
			rowIDs = append(rowIDs, id)
			tokens = append(tokens, token)
			delete(w.owned, id)
		}
	}
	return rowIDs, tokens
}

func (w *worker) settle(ids ...int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		delete(w.owned, id)
		delete(w.started, id)
	}
}

func (w *worker) beginTx() {
	w.mu.Lock()
	w.txStart = time.Now()
	w.mu.Unlock()
}

func (w *worker) endTx() {
	w.mu.Lock()
	w.txStart = time.Time{}
	w.mu.Unlock()
}

// NewProcessor validates config and prepares a processor that runs handler for every row of
// config.Consumer. Start it with Run.
func NewProcessor(db *sql.DB, handler message.HandlerFunc, config ProcessorConfig, logger watermill.LoggerAdapter) (*Processor, error) {
	if db == nil {
		return nil, errors.New("inbox: db is nil: open one with pgtx.Open")
	}
	if handler == nil {
		return nil, errors.New("inbox: handler is nil")
	}
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("inbox: invalid processor config: %w", err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	ob := config.Outbox
	if ob == nil {
		var err error
		if ob, err = outbox.NewWriter(outbox.Config{Schema: config.Schema}); err != nil {
			return nil, fmt.Errorf("inbox: %w", err)
		}
	}
	p := &Processor{
		db:      db,
		handler: handler,
		config:  config,
		logger:  logger.With(watermill.LogFields{"consumer": config.Consumer}),
		q:       newQueries(config.Schema),
		outbox:  ob,
		wake:    make(chan struct{}, config.Workers),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	p.handlerCtx, p.cancelHandlers = context.WithCancel(context.Background())
	for range config.Workers {
		p.workers = append(p.workers, &worker{owned: map[int64]int64{}, started: map[int64]bool{}})
	}
	return p, nil
}

// Counts returns the processor's running totals.
func (p *Processor) Counts() ProcessorCounts {
	return ProcessorCounts{
		Claimed:        p.claimed.Load(),
		Processed:      p.processed.Load(),
		Failed:         p.failed.Load(),
		Parked:         p.parked.Load(),
		LeaseConflicts: p.conflicts.Load(),
		LeasesExpired:  p.expired.Load(),
		Released:       p.released.Load(),
		Errors:         p.errs.Load(),
	}
}

// Close stops claiming, lets running handlers finish within ShutdownGrace, cancels the rest,
// releases every row still claimed (back to PENDING, the attempt not counted) and waits for
// Run to return. It is idempotent, and safe before Run (Run then returns at once).
func (p *Processor) Close() error {
	p.stopOnce.Do(func() { close(p.stop) })
	if p.started.Load() {
		<-p.done
	}
	return nil
}

// Run processes rows until ctx is cancelled or Close is called, then shuts down as Close
// describes and returns nil. Database errors are logged, counted and retried, never returned.
// Run may be called once.
func (p *Processor) Run(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("inbox: processor is already running (Run may be called once)")
	}
	defer close(p.done)
	defer p.cancelHandlers()

	claimCtx, stopClaiming := context.WithCancel(ctx)
	defer stopClaiming()
	go func() {
		select {
		case <-p.stop:
			stopClaiming()
		case <-claimCtx.Done():
		}
	}()
	upkeepCtx, stopUpkeep := context.WithCancel(context.WithoutCancel(ctx))
	defer stopUpkeep()

	var background sync.WaitGroup
	background.Go(func() { p.listen(claimCtx) })
	background.Go(func() { p.upkeep(claimCtx, upkeepCtx) })

	var workers sync.WaitGroup
	for _, w := range p.workers {
		workers.Go(func() { p.work(claimCtx, w) })
	}
	p.logger.Info("Inbox processor started", watermill.LogFields{"workers": p.config.Workers})
	<-claimCtx.Done()
	// Rows claimed but not started go back at once, so another instance can take them while
	// running handlers use their grace period.
	for _, w := range p.workers {
		p.releaseUnstarted(w)
	}

	finished := make(chan struct{})
	go func() { workers.Wait(); close(finished) }()
	if p.config.ShutdownGrace > 0 {
		t := time.NewTimer(p.config.ShutdownGrace)
		select {
		case <-finished:
		case <-t.C:
			p.logger.Info("Shutdown grace elapsed: cancelling running handlers", nil)
		}
		t.Stop()
	}
	p.cancelHandlers()
	select {
	case <-finished:
	case <-time.After(min(max(p.config.ShutdownGrace, 100*time.Millisecond), 5*time.Second)):
		p.logger.Error("Handlers ignore cancellation; releasing their rows without them", errors.New("handler did not return"), nil)
	}
	stopUpkeep()
	background.Wait()
	p.releaseAllOwned()
	p.logger.Info("Inbox processor stopped", nil)
	return nil
}

// claimedRow is one row returned by a claim.
type claimedRow struct {
	id          int64
	messageID   string
	uuid        string
	orderingKey string
	topic       string
	payload     []byte
	metadata    string
	attempts    int
	receivedAt  time.Time
}

func (p *Processor) work(ctx context.Context, w *worker) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		rows, token, err := p.claim(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.errs.Add(1)
			p.logger.Error("Inbox claim failed, retrying", err, watermill.LogFields{"backoff": backoff})
			if !sleep(ctx, jitter(backoff)) {
				return
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		if len(rows) == 0 {
			p.idle(ctx)
			continue
		}
		p.processClaim(ctx, w, rows, token)
	}
}

func (p *Processor) idle(ctx context.Context) {
	t := time.NewTimer(jitter(p.config.PollInterval))
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

// claim takes up to ClaimBatch due rows under a new token. The statement is not cancelled with
// ctx: rows claimed by a statement whose reply is lost would wait for their lease to expire.
func (p *Processor) claim(ctx context.Context) ([]claimedRow, int64, error) {
	if ctx.Err() != nil {
		return nil, 0, ctx.Err()
	}
	token := newToken()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.config.Lease)
	defer cancel()
	rs, err := p.db.QueryContext(qctx, p.q.claim, p.config.Consumer, p.config.ClaimBatch, token, micros(p.config.Lease))
	if err != nil {
		if pgtx.IsUndefinedTable(err) {
			return nil, 0, fmt.Errorf("inbox: table %s is missing: run the migrations: %w", p.q.table, err)
		}
		return nil, 0, fmt.Errorf("inbox: claim: %w", err)
	}
	defer rs.Close()
	var rows []claimedRow
	for rs.Next() {
		var r claimedRow
		if err := rs.Scan(&r.id, &r.messageID, &r.uuid, &r.orderingKey, &r.topic, &r.payload, &r.metadata, &r.attempts, &r.receivedAt); err != nil {
			return nil, 0, fmt.Errorf("inbox: scan claimed row: %w", err)
		}
		rows = append(rows, r)
	}
	if err := rs.Err(); err != nil {
		return nil, 0, fmt.Errorf("inbox: claim: %w", err)
	}
	slices.SortFunc(rows, func(a, b claimedRow) int { return cmp.Compare(a.id, b.id) })
	p.claimed.Add(uint64(len(rows)))
	return rows, token, nil
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
func (p *Processor) processClaim(ctx context.Context, w *worker, rows []claimedRow, token int64) {
	w.own(rows, token)
	for i := 0; i < len(rows); i += p.config.TxBatchSize {
		if ctx.Err() != nil {
			p.releaseUnstarted(w)
			return
		}
		chunk := w.begin(rows[i:min(i+p.config.TxBatchSize, len(rows))])
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

// releaseUnstarted gives back the rows a worker claimed but has not started.
func (p *Processor) releaseUnstarted(w *worker) {
	if rowIDs, tokens := w.takeUnstarted(); len(rowIDs) > 0 {
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
	outcomeRelease          // not the message's fault (shutdown, database trouble): give the row back
)

// processOne runs one row in a transaction of its own and settles it.
func (p *Processor) processOne(w *worker, r claimedRow, token int64) {
	defer w.settle(r.id)
	policy := pgtx.RetryPolicy{}
	for attempt := 1; ; attempt++ {
		res, err := p.attemptOne(w, r, token)
		if res == outcomeRetryTx && attempt < 3 {
			time.Sleep(policy.Delay(attempt))
			continue
		}
		if res == outcomeRetryTx {
			res = outcomeFailed
		}
		p.settle(r, token, res, err)
		return
	}
}

func (p *Processor) attemptOne(w *worker, r claimedRow, token int64) (outcome, error) {
	ctx, cancel := context.WithTimeout(p.handlerCtx, p.config.HandlerTimeout)
	defer cancel()
	w.beginTx()
	defer w.endTx()
	tx, err := p.db.BeginTx(ctx, p.config.TxOptions)
	if err != nil {
		return outcomeRelease, fmt.Errorf("inbox: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err := p.runHandler(ctx, tx, r); err != nil {
		return p.classifyHandler(ctx, err)
	}
	res, err := tx.ExecContext(ctx, p.q.complete, r.id, token)
	if errors.Is(err, sql.ErrTxDone) && ctx.Err() == nil {
		// The handler committed or rolled back the transaction itself. If it committed, its
		// effects are in without the row being DONE, and running it again would repeat them:
		// park the row for a person to look at.
		return outcomeFailed, middleware.Permanent(fmt.Errorf("inbox: the handler ended the processing transaction itself (never Commit or Rollback the transaction from the context): %w", err))
	}
	if err != nil {
		return p.classifyHandler(ctx, fmt.Errorf("inbox: mark done: %w", err))
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return outcomeConflict, nil
	}
	committed = true
	if err := tx.Commit(); err != nil {
		// The outcome of a failed COMMIT may be unknown; releasing is fenced, so if the commit
		// did happen the release changes nothing.
		return outcomeRelease, fmt.Errorf("inbox: commit: %w", err)
	}
	return outcomeDone, nil
}

// runHandler builds the message of r, runs the handler with tx in its context and stores the
// messages it returns in the outbox within tx.
func (p *Processor) runHandler(ctx context.Context, tx *sql.Tx, r claimedRow) error {
	msg := message.NewMessage(r.uuid, r.payload)
	if err := json.Unmarshal([]byte(r.metadata), &msg.Metadata); err != nil {
		return middleware.Permanent(fmt.Errorf("inbox: row %d: metadata is not a JSON object of strings: %w", r.id, err))
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	hctx := contextWithDelivery(ctx, Delivery{
		ID: r.id, Consumer: p.config.Consumer, MessageID: r.messageID, OrderingKey: r.orderingKey,
		Topic: r.topic, Attempt: r.attempts, ReceivedAt: r.receivedAt,
	})
	hctx = pgtx.ContextWithTx(outbox.ContextWithConsumed(hctx, msg), tx)
	msg.SetContext(hctx)
	out, err := callHandler(p.handler, msg)
	if err != nil {
		return err
	}
	if len(out) == 0 {
		return nil
	}
	if p.config.OutputTopic == "" {
		return middleware.Permanent(ErrOutputWithoutTopic)
	}
	if err := p.outbox.PublishTx(hctx, tx, p.config.OutputTopic, out...); err != nil {
		return fmt.Errorf("inbox: store handler output: %w", err)
	}
	return nil
}

func callHandler(h message.HandlerFunc, msg *message.Message) (out []*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &middleware.PanicError{Value: r, Stack: string(debug.Stack())}
		}
	}()
	return h(msg)
}

// classifyHandler decides what a failure inside the processing transaction means.
func (p *Processor) classifyHandler(ctx context.Context, err error) (outcome, error) {
	switch {
	case p.handlerCtx.Err() != nil:
		return outcomeRelease, fmt.Errorf("shutdown: %w", err)
	case pgtx.IsRetryableTx(err):
		return outcomeRetryTx, err
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return outcomeFailed, fmt.Errorf("handler exceeded HandlerTimeout (%s): %w", p.config.HandlerTimeout, err)
	case pgtx.IsConnectionError(err):
		return outcomeRelease, err
	}
	return outcomeFailed, err
}

// releaseDelay is how long a row given back unprocessed waits: not at all at shutdown (another
// instance may take it at once), Backoff after database trouble.
func (p *Processor) releaseDelay() time.Duration {
	if p.handlerCtx.Err() != nil {
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
		if p.handlerCtx.Err() != nil {
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
	err := p.db.QueryRowContext(ctx, p.q.fail, r.id, token, middleware.IsPermanent(cause), p.config.MaxAttempts, micros(delay), errorText(cause)).Scan(&status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		p.conflicts.Add(1)
		p.logger.Info("Attempt failed after its lease was lost; another worker owns the row", fields.Add(watermill.LogFields{"err": cause.Error()}))
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
	d := p.config.Backoff << min(max(attempt-1, 0), 30)
	if d <= 0 || d > p.config.MaxBackoff {
		d = p.config.MaxBackoff
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

func errorText(err error) string {
	s := strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", ""), "?")
	if len(s) > 4000 {
		s = strings.ToValidUTF8(s[:4000], "") + "..."
	}
	return s
}

// processBatch runs several rows in one transaction and completes them with one statement.
// Any failure rolls everything back and falls back to one transaction per row.
func (p *Processor) processBatch(w *worker, rows []claimedRow, token int64) {
	res, lost := p.attemptBatch(w, rows, token)
	switch res {
	case outcomeDone:
		p.processed.Add(uint64(len(rows)))
		w.settle(ids(rows)...)
		return
	case outcomeRelease:
		if p.handlerCtx.Err() == nil {
			p.errs.Add(1)
		}
		p.release(rows, token, p.releaseDelay())
		w.settle(ids(rows)...)
		return
	}
	for _, r := range rows {
		if lost[r.id] {
			p.conflicts.Add(1)
			p.logger.Info("Lease lost before completion: rolled back, another worker owns the row", watermill.LogFields{"row": r.id})
			w.settle(r.id)
			continue
		}
		p.processOne(w, r, token)
	}
}

// attemptBatch returns outcomeDone, outcomeRelease (commit failed or shutdown: give the rows
// back) or outcomeFailed (fall back to one row per transaction, skipping the lost rows).
func (p *Processor) attemptBatch(w *worker, rows []claimedRow, token int64) (res outcome, lost map[int64]bool) {
	ctx, cancel := context.WithTimeout(p.handlerCtx, p.config.HandlerTimeout)
	defer cancel()
	w.beginTx()
	defer w.endTx()
	tx, err := p.db.BeginTx(ctx, p.config.TxOptions)
	if err != nil {
		p.logger.Error("Batch begin failed; giving its rows back", err, watermill.LogFields{"rows": len(rows)})
		return outcomeRelease, nil
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	for _, r := range rows {
		if err := p.runHandler(ctx, tx, r); err != nil {
			if p.handlerCtx.Err() != nil {
				return outcomeRelease, nil
			}
			p.logger.Debug("Handler failed in a batch; processing the batch row by row", watermill.LogFields{"row": r.id, "err": err.Error()})
			return outcomeFailed, nil
		}
	}
	done, err := tx.ExecContext(ctx, p.q.completeMany, ids(rows), token)
	if err != nil {
		return outcomeFailed, nil
	}
	if n, _ := done.RowsAffected(); int(n) != len(rows) {
		_ = tx.Rollback()
		return outcomeFailed, p.lostRows(rows, token)
	}
	committed = true
	if err := tx.Commit(); err != nil {
		// Possibly committed after all; the release is fenced and then changes nothing.
		p.logger.Error("Batch commit failed; giving its rows back", err, watermill.LogFields{"rows": len(rows)})
		return outcomeRelease, nil
	}
	return outcomeDone, nil
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

// upkeep renews the leases workers hold and reaps expired ones. Reaping stops with claimCtx;
// renewal goes on until upkeepCtx ends, so handlers finishing during the shutdown grace keep
// their claims.
func (p *Processor) upkeep(claimCtx, upkeepCtx context.Context) {
	var renew <-chan time.Time
	if p.config.RenewInterval > 0 {
		t := time.NewTicker(p.config.RenewInterval)
		defer t.Stop()
		renew = t.C
	}
	reap := time.NewTicker(max(p.config.ReapInterval, time.Millisecond))
	defer reap.Stop()
	reapC, reaping := reap.C, claimCtx.Done()
	for {
		select {
		case <-upkeepCtx.Done():
			return
		case <-reaping:
			reapC, reaping = nil, nil
		case <-renew:
			p.renew(upkeepCtx)
		case <-reapC:
			p.reap(upkeepCtx)
		}
	}
}

func (p *Processor) renew(ctx context.Context) {
	var rowIDs, tokens []int64
	for _, w := range p.workers {
		w.mu.Lock()
		// A transaction running past HandlerTimeout is stuck (its handler ignores the
		// cancellation): stop renewing so that its rows can be claimed by others.
		if w.txStart.IsZero() || time.Since(w.txStart) < p.config.HandlerTimeout {
			for id, token := range w.owned {
				rowIDs = append(rowIDs, id)
				tokens = append(tokens, token)
			}
		}
		w.mu.Unlock()
	}
	if len(rowIDs) == 0 {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, p.config.RenewInterval)
	defer cancel()
	if _, err := p.db.ExecContext(qctx, p.q.renew, rowIDs, tokens, micros(p.config.Lease)); err != nil && ctx.Err() == nil {
		p.errs.Add(1)
		p.logger.Error("Lease renewal failed", err, watermill.LogFields{"rows": len(rowIDs)})
	}
}

func (p *Processor) reap(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rs, err := p.db.QueryContext(qctx, p.q.reap, p.config.Consumer, p.config.MaxAttempts)
	if err != nil {
		if ctx.Err() == nil {
			p.errs.Add(1)
			p.logger.Error("Reaping expired leases failed", err, nil)
		}
		return
	}
	defer rs.Close()
	pending := 0
	for rs.Next() {
		var id int64
		var status string
		if err := rs.Scan(&id, &status); err != nil {
			p.errs.Add(1)
			return
		}
		p.expired.Add(1)
		if Status(status) == StatusFailed {
			p.parked.Add(1)
			p.logger.Error("Lease expired on the last attempt: row parked as FAILED", errors.New("lease expired"), watermill.LogFields{"row": id})
		} else {
			pending++
			p.logger.Info("Lease expired: row taken back for another attempt", watermill.LogFields{"row": id})
		}
	}
	if pending > 0 {
		p.wakeAll()
	}
}

// errNotPgx stops the listener for good: LISTEN needs pgx's stdlib driver.
var errNotPgx = errors.New("the *sql.DB does not use pgx's stdlib driver")

// listen keeps a dedicated connection LISTENing on the schema's channel and wakes idle workers
// when rows for this consumer arrive. Without it, workers poll every PollInterval.
func (p *Processor) listen(ctx context.Context) {
	if p.config.DisableListen {
		return
	}
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := p.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNotPgx) {
			p.logger.Info("LISTEN/NOTIFY unavailable, idle workers poll every PollInterval", watermill.LogFields{"reason": err.Error(), "poll_interval": p.config.PollInterval})
			return
		}
		p.errs.Add(1)
		p.logger.Error("LISTEN connection lost; polling until it is back", err, watermill.LogFields{"backoff": backoff})
		if !sleep(ctx, jitter(backoff)) {
			return
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (p *Processor) listenOnce(ctx context.Context) error {
	conn, err := p.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("inbox: LISTEN connection: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `LISTEN `+pgtx.QuoteIdentifier(p.q.channel)); err != nil {
		return fmt.Errorf("inbox: LISTEN: %w", err)
	}
	p.wakeAll() // rows may have arrived while nobody listened
	for {
		err := conn.Raw(func(driverConn any) error {
			c, ok := driverConn.(*stdlib.Conn)
			if !ok {
				return errNotPgx
			}
			n, err := c.Conn().WaitForNotification(ctx)
			if err != nil {
				// Discard the connection: it may be left mid-read, and it is still LISTENing.
				return fmt.Errorf("%w: %w", driver.ErrBadConn, err)
			}
			if n.Payload == p.config.Consumer {
				p.wakeAll()
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + time.Duration(rand.Int64N(int64(d)/2+1))
}
