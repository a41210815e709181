package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/txguard"
	iworker "github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// ProcessorConfig configures a Processor.
type ProcessorConfig struct {
	// Schema holds the inbox and outbox tables. Default pgtx.DefaultSchema.
	Schema string
	// Consumer whose rows this processor works: the ReceiverConfig.Consumer. Required.
	Consumer string

	// Workers process rows concurrently, each in its own transactions. Default 4. The pool
	// needs Workers connections plus up to three more (LISTEN, lease upkeep, operations).
	// Rows of one ordering key never run at the same time; other rows do, in this and in
	// every other Processor of the Consumer: see TxOptions for handlers that read before
	// they write.
	Workers int
	// BatchSize is the most rows a worker claims at once. Default 16. Without lease renewal
	// the whole claimed batch must be processed within Lease.
	BatchSize int
	// TxBatchSize > 1 processes that many claimed rows in one transaction and completes them
	// with one statement. If any handler in the batch fails, or a lease was lost, the whole
	// transaction is rolled back and its rows are processed again one per transaction, so
	// handlers must not mind running more than once without effect (their database writes are
	// rolled back; effects outside the database are not). Default 1.
	TxBatchSize int
	// ClaimMode is how workers hold rows: ClaimLease (default: IN_PROGRESS rows with fenced
	// leases) or ClaimLock (row locks inside the processing transaction, each row written once;
	// see ClaimLock for what changes). With ClaimLock each transaction locks up to TxBatchSize
	// rows and BatchSize is not used.
	ClaimMode ClaimMode

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
	// Outbox stores returned messages. Default: a Writer on Schema with OutboxSource.
	Outbox *outbox.Writer
	// OutboxSource is the default Outbox's outbox.Config.Source: the service whose relay forwards
	// these messages when services share one schema (see outbox, Sources). Set it, or pass the
	// service's own Writer as Outbox, wherever the service's relay has a Source: rows of another
	// source are never forwarded by it. Setting both is an error.
	OutboxSource string
	// TxOptions of the processing transactions. Default READ COMMITTED. Handlers of
	// different rows run at the same time (Workers), so at READ COMMITTED a handler that
	// reads a row and writes back a value computed from it (read a counter, add one, write
	// it) loses the updates of handlers that commit in between. Make such a handler exact by
	// computing in SQL (SET n = n + 1), by locking what it reads (SELECT ... FOR UPDATE), or
	// by giving the messages that touch one row one ordering key (ReceiverConfig.OrderingKey):
	// their rows run one at a time. REPEATABLE READ makes it exact too but is not the
	// default, unlike the effectively-once middleware's: here a serialization failure counts
	// as a failed attempt once the retries are spent (three new transactions with
	// ClaimLease; with ClaimLock three retries in a savepoint, which keeps the snapshot, so
	// they cannot succeed), so MaxAttempts can park the rows of a contended counter; and
	// with ClaimLease a handler running longer than RenewInterval never completes (the lease
	// renewal updates its row after the transaction's snapshot, so marking it DONE fails
	// with 40001 every time).
	TxOptions *sql.TxOptions
	// TracerProvider traces every attempt: a consumer span per row and attempt, the child of
	// the trace context the message carries, with the handler and the outbox store as child
	// spans and the COMMIT as an event (see the package doc, Tracing). It is also the default
	// Outbox's TracerProvider. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func (c *ProcessorConfig) setDefaults() {
	if c.Schema == "" {
		c.Schema = pgtx.DefaultSchema
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.BatchSize == 0 {
		c.BatchSize = 16
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
	if c.Outbox != nil && c.OutboxSource != "" {
		errs = append(errs, errors.New("set OutboxSource or Outbox, not both: give the Writer its Source (outbox.Config.Source)"))
	}
	if err := validateConsumer(c.Consumer); err != nil {
		errs = append(errs, err)
	}
	if c.Workers < 1 || c.Workers > 1024 {
		errs = append(errs, fmt.Errorf("Workers must be between 1 and 1024, got %d", c.Workers))
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		errs = append(errs, fmt.Errorf("BatchSize must be between 1 and %d, got %d", MaxBatchSize, c.BatchSize))
	}
	switch c.ClaimMode {
	case ClaimLease:
		if c.TxBatchSize < 1 || c.TxBatchSize > c.BatchSize {
			errs = append(errs, fmt.Errorf("TxBatchSize must be between 1 and BatchSize (%d), got %d", c.BatchSize, c.TxBatchSize))
		}
	case ClaimLock:
		if c.TxBatchSize < 1 || c.TxBatchSize > MaxBatchSize {
			errs = append(errs, fmt.Errorf("TxBatchSize must be between 1 and %d, got %d", MaxBatchSize, c.TxBatchSize))
		}
	default:
		errs = append(errs, fmt.Errorf("ClaimMode %d is not one of ClaimLease, ClaimLock", int(c.ClaimMode)))
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

// ProcessorCounters are a processor's running totals since it was created.
type ProcessorCounters struct {
	Claimed        uint64 // rows claimed
	Processed      uint64 // rows moved to DONE
	Failed         uint64 // failed attempts: handler error or panic, timeout, output refused
	Parked         uint64 // rows moved to FAILED by this processor (limit, permanent error, expired last lease)
	LeaseConflicts uint64 // changes refused because the claim had been lost to lease expiry
	LeasesExpired  uint64 // expired claims this processor took back (from any worker)
	Released       uint64 // rows given back unprocessed (shutdown, database trouble)
	Errors         uint64 // database errors outside handlers (claim, commit, renewal, reaping)
	// HandlerEndedTx counts attempts whose handler called Commit or Rollback on the processing
	// transaction it was lent: nothing of them was applied (the attempt guard refused the
	// COMMIT), and each parked its row at once. Also counted in Failed.
	HandlerEndedTx uint64
}

// Processor works through one consumer's inbox rows with a plain Watermill handler.
//
// Guarantees:
//   - Each row is applied at most once: the handler runs in a transaction together with the
//     row's move to DONE and the messages it emits (stored in the outbox, forwarded later by the
//     relay). The move is fenced by the claim token, so a worker whose lease ran out and whose
//     row was claimed again cannot complete it: its transaction, handler effects included, is
//     rolled back and the conflict counted.
//   - The Processor commits the transaction, never the handler: while a handler runs, the
//     schema's attempt guard (migrations 010 and 011) refuses any COMMIT, so a handler that
//     calls Commit (or Rollback) on the transaction from its context applies nothing, neither
//     its writes nor its outputs, and its row is parked as FAILED at once with a reason that
//     says the handler ended the transaction (wmonce.ErrHandlerEndedTx, counted in
//     HandlerEndedTx). The other rows of its TxBatchSize batch run again, one per
//     transaction, and are applied once each.
//   - Each row is attempted until it is DONE or parked: a failed attempt (error, panic,
//     timeout) is recorded with the error and retried after an exponential backoff with
//     jitter; a permanent error (wmonce.Permanent) or the MaxAttempts-th failure parks the
//     row as FAILED, where it waits for Ops.Replay or a skip. An attempt that ends its worker's
//     process or database connection (killed, crashed, terminated backend) still counts, in
//     both claim modes, so a message that crashes its worker is parked rather than retried
//     forever.
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
	guard   txguard.Guard
	step    lend.Step // runs the handler in the processing transaction and stores its output
	tracer  trace.Tracer

	workers []*worker // of the current Run
	wake    chan struct{}

	life iworker.Runner
	// hctx is the parent of every processing transaction of the current Run (see handlerCtx).
	hctx atomic.Pointer[context.Context]

	claimed, processed, failed, parked, conflicts, expired, released, errs, endedTx atomic.Uint64

	guardFound atomic.Bool // the schema has the attempt guard (see requireGuard)

	floor, lastRescan atomic.Int64 // see claimAfter
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

// takeUnstarted removes and returns the owned rows not started yet, except keep.
func (w *worker) takeUnstarted(keep ...int64) (rowIDs, tokens []int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, token := range w.owned {
		if !w.started[id] && !slices.Contains(keep, id) {
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
	logger, err := setup.Component(db, "inbox: db is nil: open one with pgtx.Open", &config, (*ProcessorConfig).setDefaults, "inbox: invalid processor config", logger)
	if err != nil {
		return nil, err
	}
	if handler == nil {
		return nil, errors.New("inbox: handler is nil")
	}
	ob, err := outbox.WriterOrDefault(config.Outbox, outbox.Config{Schema: config.Schema, Source: config.OutboxSource, TracerProvider: config.TracerProvider})
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	p := &Processor{
		db:      db,
		handler: handler,
		config:  config,
		logger:  logger.With(watermill.LogFields{"consumer": config.Consumer}),
		q:       newQueries(config.Schema),
		guard:   txguard.New(config.Schema),
		tracer:  tracing.Tracer(config.TracerProvider),
		wake:    make(chan struct{}, config.Workers),
	}
	p.step = lend.Step{
		Component: "inbox", Guard: p.guard, Outbox: ob, Tracer: p.tracer,
		NoTopic: "ProcessorConfig.OutputTopic is empty: set it, or publish through outbox.Writer.Publisher() with the message context",
	}
	hctx := context.Background()
	p.hctx.Store(&hctx)
	return p, nil
}

// handlerCtx is the parent of every processing transaction of the current Run; it is cancelled
// when that Run's shutdown grace runs out.
func (p *Processor) handlerCtx() context.Context { return *p.hctx.Load() }

// Counters returns the processor's running totals.
func (p *Processor) Counters() ProcessorCounters {
	return ProcessorCounters{
		Claimed:        p.claimed.Load(),
		Processed:      p.processed.Load(),
		Failed:         p.failed.Load(),
		Parked:         p.parked.Load(),
		LeaseConflicts: p.conflicts.Load(),
		LeasesExpired:  p.expired.Load(),
		Released:       p.released.Load(),
		Errors:         p.errs.Load(),
		HandlerEndedTx: p.endedTx.Load(),
	}
}

// Close stops claiming, lets running handlers finish within ShutdownGrace, cancels the rest,
// releases every row still claimed (back to PENDING, the attempt not counted) and waits for
// Run to return. It is idempotent and final: a Run after Close returns nil at once.
func (p *Processor) Close() error { return p.life.Close() }

// Run processes rows until ctx is cancelled or Close is called, then shuts down as Close
// describes and returns nil. Database errors are logged, counted and retried, never returned.
// One Run at a time: a second concurrent Run returns an error; Run may be called again after
// it returned.
func (p *Processor) Run(ctx context.Context) error { return p.life.Run(ctx, p.run) }

func (p *Processor) run(claimCtx context.Context) error {
	handlerCtx, cancelHandlers := context.WithCancel(context.Background())
	defer cancelHandlers()
	p.hctx.Store(&handlerCtx)
	p.workers = make([]*worker, p.config.Workers)
	for i := range p.workers {
		p.workers[i] = &worker{owned: map[int64]int64{}, started: map[int64]bool{}}
	}
	upkeepCtx, stopUpkeep := context.WithCancel(context.WithoutCancel(claimCtx))
	defer stopUpkeep()

	var background sync.WaitGroup
	background.Go(func() { p.listen(claimCtx) })
	background.Go(func() { p.upkeep(claimCtx, upkeepCtx) })

	var workers sync.WaitGroup
	for _, w := range p.workers {
		if p.config.ClaimMode == ClaimLock {
			workers.Go(func() { p.workLocked(claimCtx) })
		} else {
			workers.Go(func() { p.work(claimCtx, w) })
		}
	}
	p.logger.Info("Inbox processor started", watermill.LogFields{"workers": p.config.Workers, "claim_mode": p.config.ClaimMode.String()})
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
	cancelHandlers()
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
