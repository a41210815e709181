package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/internal/replan"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/txguard"
	iworker "github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/outbox"
)

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
	// HandlerAcked counts attempts whose handler called Ack or Nack on the message it was given:
	// a message of its own, with no delivery behind it (the Receiver acked the delivery when the
	// row was stored), so the call changes nothing; logged once as a warning. Also counted in
	// the attempt's outcome.
	HandlerAcked uint64
}

// Processor works through one consumer's inbox rows with a plain Watermill handler. It
// guarantees what the package doc's "Processing", "Retries and parking" and "Order" say: each
// row applied once, in one transaction with its move to DONE and its output, which the
// Processor commits; failed attempts retried with backoff, then parked as FAILED; per-key
// order; leases fenced by a claim token. Where it stops: effects outside the database and
// returned messages are at-least-once.
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

	claimed, processed, failed, parked, conflicts, expired, released, errs, endedTx, handlerAcked atomic.Uint64

	guardFound atomic.Bool // the schema has the attempt guard (see requireGuard)

	floor, lastRescan, rescanTook atomic.Int64  // see claimAfter
	replan                        replan.Prefix // see replanned

	testSignals processorTestSignals
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
	ob := config.Outbox
	if ob == nil {
		w, err := outbox.NewWriter(outbox.Config{Schema: config.Schema, Source: config.OutboxSource, TracerProvider: config.TracerProvider})
		if err != nil {
			return nil, fmt.Errorf("inbox: %w", err)
		}
		ob = w
	}
	p := &Processor{
		db:      db,
		handler: handler,
		config:  config,
		logger:  logger.With(watermill.LogFields{"consumer": config.Consumer}),
		q:       newQueries(config.Schema),
		guard:   txguard.For(config.Schema, db),
		replan:  replan.For(db),
		tracer:  tracing.Tracer(config.TracerProvider),
		wake:    make(chan struct{}, config.Workers),
	}
	p.step = lend.Step{
		Component: "inbox", Guard: p.guard, Outbox: ob, Tracer: p.tracer, Logger: p.logger,
		NoTopic: "ProcessorConfig.OutputTopic is empty: set it, or publish through outbox.Writer.Publisher() with the message context",
	}
	hctx := context.Background()
	p.hctx.Store(&hctx)
	return p, nil
}

// Consumer is the consumer whose rows the processor works on: the label its metrics carry.
func (p *Processor) Consumer() string { return p.config.Consumer }

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
		HandlerAcked:   p.handlerAcked.Load(),
	}
}

// count adds rows to the counter that as names (settledParked: Parked only; an attempt that
// parked its row also counts in Failed, which the caller adds) and sends their Settled test
// signals, once what happened to them is committed.
func (p *Processor) count(as settledAs, cause error, rows ...claimedRow) {
	var counter *atomic.Uint64
	switch as {
	case settledDone:
		counter = &p.processed
	case settledFailed:
		counter = &p.failed
	case settledParked:
		counter = &p.parked
	case settledReleased:
		counter = &p.released
	case settledLeaseLost:
		counter = &p.conflicts
	}
	counter.Add(uint64(len(rows)))
	for _, r := range rows {
		p.testSignals.Settled.Signal(settledRow{ID: r.id, As: as, Err: cause})
	}
}

// awaitHandlers lets the running handlers (workers) finish within ShutdownGrace, then cancels
// them (cancelHandlers) and waits a last while (ShutdownGrace, between 100ms and 5s) for those
// that still run: after it their rows are released without them.
func (p *Processor) awaitHandlers(workers *sync.WaitGroup, cancelHandlers context.CancelFunc) {
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
}

// handlerCtx is the parent of every processing transaction of the current Run; it is cancelled
// when that Run's shutdown grace runs out.
func (p *Processor) handlerCtx() context.Context { return *p.hctx.Load() }

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
		workers.Go(func() { p.work(claimCtx, w) })
	}
	p.logger.Info("Inbox processor started", watermill.LogFields{"workers": p.config.Workers})
	<-claimCtx.Done()
	// Rows claimed but not started go back at once, so another instance can take them while
	// running handlers use their grace period.
	for _, w := range p.workers {
		p.releaseUnstarted(w)
	}

	p.awaitHandlers(&workers, cancelHandlers)
	stopUpkeep()
	background.Wait()
	p.releaseAllOwned()
	p.logger.Info("Inbox processor stopped", nil)
	return nil
}
