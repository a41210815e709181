package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// Variant ids.
const (
	B0        = "B0"
	B1        = "B1"
	B2        = "B2"
	B3        = "B3"
	B4        = "B4"
	B5Ingest  = "B5-ingest"
	B5Process = "B5-process"
	B6        = "B6"
	B7        = "B7"
	B7Process = "B7-process"
	Relay     = "relay"
	RelayLane = "relay-lanes"
	Forwarder = "forwarder"
	C1Single  = "C1-single"
	C1Batch   = "C1-batch"
	E2E50     = "e2e-50"
	E2E1000   = "e2e-1000"
	// Idle query rates (no traffic): the relay, a SQL-broker subscription, and the same
	// subscription polling as watermill-sql does.
	IdleRelay   = "idle-relay"
	IdleSQLSub  = "idle-sql-sub"
	IdleSQLPoll = "idle-sql-poll"
)

// variantTitles say in a few words what each variant runs.
var variantTitles = map[string]string{
	B0:          "bare handler, no database (broker ceiling)",
	B1:          "business write in its own transaction, no dedupe (at-least-once)",
	B2:          "B1 + Watermill's in-memory Deduplicator (not crash-safe)",
	B3:          "effectively-once middleware, one transaction per message (GroupCommit.Disabled; over SQL the subscriber's transaction, the default there)",
	B4:          "effectively-once middleware, group commit (the default; over SQL with DisableSubscriberTxReuse)",
	B5Ingest:    "inbox receiver: store and ack (group-committed ingest)",
	B5Process:   "inbox processor, lease claims (IN_PROGRESS rows), business write per row",
	B6:          "watermill-sql subscriber, business write in its transaction, no dedupe",
	B7Process:   "inbox processor as B5-process, the business write as one multi-row INSERT per transaction (once.BatchHandler)",
	B7:          "effectively-once middleware, group commit, once.BatchHandler: B1's write as one multi-row INSERT per group",
	Relay:       "watermill-once outbox Relay to the broker, strict commit order (default)",
	RelayLane:   "outbox Relay with PublishLanes (64): concurrent Publish calls, order kept per partition key",
	Forwarder:   "Watermill components/forwarder (SQL topic of envelopes) to the broker",
	C1Single:    "raw INSERT ... ON CONFLICT DO NOTHING into processed_messages, one row per statement",
	C1Batch:     "raw INSERT ... SELECT unnest(...) ON CONFLICT DO NOTHING, 100 rows per statement",
	E2E50:       "end to end at 50 events/s: producer commit (outbox) -> Relay -> broker -> effectively-once commit",
	E2E1000:     "end to end at 1,000 events/s, as e2e-50",
	IdleRelay:   "queries/s of an outbox Relay with no traffic",
	IdleSQLSub:  "queries/s of one SQL-broker subscription with no traffic (wake-ups on)",
	IdleSQLPoll: "queries/s of one SQL-broker subscription with no traffic, DisableListen (polling)",
}

// latencyVariants report end-to-end latency; idleVariants report queries per second.
var (
	latencyVariants = []string{E2E50, E2E1000}
	idleVariants    = []string{IdleRelay, IdleSQLSub, IdleSQLPoll}
)

// consumingVariants read the published messages through a router.
var consumingVariants = []string{B0, B1, B2, B3, B4, B5Ingest, B6, B7}

// namedOnlyVariants run only when -variants names them.
var namedOnlyVariants []string

// allVariants in report order.
var allVariants = []string{B0, B1, B2, B3, B4, B5Ingest, B5Process, B6, B7, B7Process, Relay, RelayLane, Forwarder, C1Single, C1Batch, E2E50, E2E1000, IdleRelay, IdleSQLSub, IdleSQLPoll}

// Result is one variant measured over one broker.
type Result struct {
	Variant    string   `json:"variant"`
	Broker     string   `json:"broker"`
	MsgsPerSec float64  `json:"msgs_per_sec"`
	P50ms      *float64 `json:"p50_ms"`
	P99ms      *float64 `json:"p99_ms"`
	Messages   int      `json:"messages"`
	InFlight   int      `json:"in_flight"`
	Seconds    float64  `json:"seconds"`
	// MachineBusyPct is the share of all CPUs busy (anything on the machine) while the variant
	// ran; BenchCPUPct the share used by this process. The rest of the busy share is
	// PostgreSQL, the broker and whatever else runs on the machine.
	MachineBusyPct float64 `json:"machine_busy_pct"`
	BenchCPUPct    float64 `json:"bench_cpu_pct"`
	// BenchCPUms1k and PGCPUms1k are the CPU milliseconds that this process and the benchmark's
	// PostgreSQL backends spent per 1,000 messages of the variant (see cpu.go); nil when unknown.
	BenchCPUms1k *float64 `json:"bench_cpu_ms_per_1k,omitempty"`
	PGCPUms1k    *float64 `json:"pg_cpu_ms_per_1k,omitempty"`
	// PGSessions summarises what the benchmark's PostgreSQL sessions were doing (sampled).
	PGSessions string `json:"pg_sessions,omitempty"`
	// QueriesPerSec is set by the idle variants: queries sent to PostgreSQL per second.
	QueriesPerSec *float64 `json:"queries_per_sec,omitempty"`
	// Stages is set by the e2e variants: where the latency was spent.
	Stages *Stages `json:"stages,omitempty"`
	Notes  string  `json:"notes"`
	Error  string  `json:"error,omitempty"`
	Round  int     `json:"round,omitempty"` // in Report.Rounds
}

func ms(v float64) *float64 { return &v }

// measurement wraps the measured part of a variant: CPU use, PostgreSQL session states and,
// when asked for, a CPU profile.
type measurement struct {
	h       *harness
	name    string
	cpu0    cpuSample
	waits   *waitSampler
	profile *os.File

	benchCPU, pgCPU float64 // seconds, set by stop
	pgKnown         bool
}

func (h *harness) startMeasuring(name string) *measurement {
	m := &measurement{h: h, name: name, cpu0: readCPU(), waits: startWaitSampler(h.db, appName, 50*time.Millisecond)}
	if h.opts.profileDir != "" {
		f, err := os.Create(filepath.Join(h.opts.profileDir, strings.ToLower(name)+".pprof"))
		if err == nil {
			if pprof.StartCPUProfile(f) == nil {
				m.profile = f
			} else {
				f.Close()
			}
		}
	}
	return m
}

func (m *measurement) stop(res *Result) {
	if m.profile != nil {
		pprof.StopCPUProfile()
		if err := m.profile.Close(); err != nil { // a profile cut short on disk would mislead
			m.h.logger.Error("CPU profile "+m.profile.Name()+" may be incomplete", err, nil)
		}
	}
	cpu1 := readCPU()
	res.MachineBusyPct, res.BenchCPUPct = cpuUse(m.cpu0, cpu1)
	res.PGSessions = m.waits.finish(3)
	m.benchCPU = cpu1.self - m.cpu0.self
	m.pgCPU, m.pgKnown = m.waits.backends.seconds()
	m.cpuPerMessage(res)
}

// cpuPerMessage sets res's CPU per 1,000 messages (stop does when res.Messages is set by then).
func (m *measurement) cpuPerMessage(res *Result) {
	setCPUPerMessage(res, m.benchCPU, m.pgCPU, m.pgKnown)
}

// consume runs one consuming variant over a rig: a router with the variant's middleware and
// handler reads the n published messages with a consumer group of its own.
func (h *harness) consume(ctx context.Context, r *rig, id string) (Result, error) {
	n := h.opts.messages
	res := Result{Variant: id, Broker: r.label(), Messages: n, InFlight: r.messagesInFlight()}
	q := func(t string) string { return pgtx.QualifiedName(h.opts.schema, t) }
	insert := `INSERT INTO ` + q("bench_effects") + ` (message_id, payload) VALUES ($1, $2)`
	inTx := func(tx *sql.Tx, msg *message.Message) error {
		_, err := tx.ExecContext(msg.Context(), insert, msg.UUID, msg.Payload)
		return err
	}
	ownTx := func(msg *message.Message) error {
		return pgtx.RunInTx(msg.Context(), h.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, insert, msg.UUID, msg.Payload)
			return err
		})
	}
	inCtxTx := func(msg *message.Message) error {
		tx, ok := pgtx.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no transaction in the message context")
		}
		return inTx(tx, msg)
	}
	consumer := "bench-" + strings.ToLower(id)

	var mws []message.HandlerMiddleware
	var handler message.NoPublishHandlerFunc
	var cleanup, describe []func()
	// Effects that commit with watermill-sql's subscriber transaction are in only once the
	// subscriber commits its batch, after the acks: wait for them, not for the handlers.
	waitForCommit := false
	defer func() {
		for _, c := range cleanup {
			c()
		}
	}()
	wantEffects, wantClaims := n, 0
	switch id {
	case B0:
		handler = func(*message.Message) error { return nil }
		wantEffects = 0
		res.Notes = "handler returns at once"
	case B1:
		handler = ownTx
		res.Notes = "pgtx.RunInTx: BEGIN, INSERT, COMMIT per message"
	case B2:
		repo, err := wmiddleware.NewMapExpiringKeyRepository(time.Hour)
		if err != nil {
			return res, err
		}
		// Every field set: Middleware() applies defaults to unset ones on each call, which is a
		// data race when one Deduplicator serves several handlers.
		d := &wmiddleware.Deduplicator{
			KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
			Repository: repo,
			Timeout:    time.Minute,
		}
		mws = append(mws, d.Middleware)
		handler = ownTx
		res.Notes = "Deduplicator keyed by UUID, map repository (1h window), then B1"
	case B3, B4:
		cfg := once.Config{Schema: h.opts.schema, Consumer: consumer}
		res.Notes = "GroupCommit.Disabled: claim + business write + commit in one transaction per message"
		cfg.GroupCommit.Disabled = true
		if r.kind == broker.SQL && id == B3 {
			res.Notes = "default over SQL: reuses the subscriber's transaction, one savepoint per message"
		}
		if id == B4 {
			cfg.GroupCommit = once.GroupCommitConfig{Workers: h.opts.groupWorkers}
			res.Notes = "the default: GroupCommit (Workers 2, TxBatchSize 100, Linger 0)"
			if h.opts.groupWorkers > 0 {
				res.Notes = fmt.Sprintf("GroupCommit Workers %d, TxBatchSize 100, Linger 0", h.opts.groupWorkers)
			}
			if r.kind == broker.SQL {
				// Messages in the subscriber's transaction are not grouped.
				cfg.DisableSubscriberTxReuse = true
				res.Notes += "; DisableSubscriberTxReuse (grouping needs our own transactions)"
			}
		}
		eo, err := once.New(h.db, cfg, h.logger)
		if err != nil {
			return res, err
		}
		cleanup = append(cleanup, func() { _ = eo.Close() })
		mws = append(mws, eo.Middleware)
		handler = inCtxTx
		wantClaims = n
		if id == B4 {
			describe = append(describe, func() {
				if c := eo.Counters(); c.GroupCommitTransactions > 0 {
					txs, msgs := c.GroupCommitTransactions, c.GroupCommitMessages
					res.Notes += fmt.Sprintf("; avg group %.1f msgs/tx", float64(msgs)/float64(txs))
				}
			})
		} else if r.kind == broker.SQL {
			waitForCommit = true
		}
	case B7:
		eo, err := h.batchVariant(r, &res, consumer, &handler, &describe)
		if err != nil {
			return res, err
		}
		cleanup = append(cleanup, func() { _ = eo.Close() })
		mws = append(mws, eo.Middleware)
		wantClaims = n
	case B5Ingest:
		rc, err := inbox.NewReceiver(h.db, inbox.ReceiverConfig{Schema: h.opts.schema, Consumer: consumer}, h.logger)
		if err != nil {
			return res, err
		}
		cleanup = append(cleanup, func() { _ = rc.Close() })
		handler = rc.Handle
		wantEffects = 0
		describe = append(describe, func() {
			c := rc.Counters()
			res.Notes = fmt.Sprintf("ReceiverConfig defaults (Workers 2, BatchSize 500); avg %.1f rows/statement", float64(c.Stored)/float64(max(c.Batches, 1)))
		})
	case B6:
		if r.kind != broker.SQL {
			return res, errSkip
		}
		handler = func(msg *message.Message) error {
			tx, ok := pgtx.SubscriberTxFromContext(msg.Context())
			if !ok {
				return errors.New("no watermill-sql transaction in the message context")
			}
			return inTx(tx, msg)
		}
		res.Notes = "sql.TxFromContext; the subscriber commits once per batch"
		waitForCommit = true
	case FRetry, FRetryShort, FDelayed, FDelayedShort:
		f, err := h.failingVariant(ctx, r, id, consumer, inCtxTx)
		if err != nil {
			return res, err
		}
		cleanup = append(cleanup, f.close)
		mws, handler, res.Notes = f.mws, f.handler, f.notes
	default:
		return res, fmt.Errorf("unknown consuming variant %q", id)
	}

	m := newMeter(n)
	meter := m.Middleware
	if isFailingVariant(id) { // the healthy messages/s: what the failing ones' retries cost them
		m = newMeter(healthyOf(n))
		meter = healthyOnly(m.Middleware)
		res.Messages = healthyOf(n)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, h.logger)
	if err != nil {
		return res, err
	}
	router.AddMiddleware(append([]message.HandlerMiddleware{meter}, mws...)...)
	// One subscriber per handler: the router closes each handler's subscriber when the handler
	// stops, and watermill-sql's Subscriber.Close is not safe to call from several goroutines
	// at once. Subscribers are closed here only if the router never ran.
	var subs []message.Subscriber
	defer func() {
		for _, sub := range subs {
			_ = sub.Close()
		}
	}()
	for ti, t := range r.topics {
		for k := range r.handlersPerTopic() {
			sub, err := r.b.NewSubscriber(r.group(id))
			if err != nil {
				return res, err
			}
			subs = append(subs, sub)
			router.AddConsumerHandler(fmt.Sprintf("%s-%d-%d", strings.ToLower(id), ti, k), t, sub, handler)
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerErr := make(chan error, 1)
	go func() { routerErr <- router.Run(runCtx) }()
	subs = nil // the router owns them now

	waitCtx, waitCancel := context.WithTimeout(ctx, h.opts.variantTimeout)
	defer waitCancel()
	// Measure from the first message: consumer group joins and subscriptions are not counted.
	for m.first.Load() == 0 && waitCtx.Err() == nil {
		select {
		case err := <-routerErr:
			return res, fmt.Errorf("router stopped before the first message: %w", err)
		case <-time.After(time.Millisecond):
		}
	}
	meas := h.startMeasuring(r.label() + "-" + id)
	err = m.wait(waitCtx)
	if err == nil && waitForCommit {
		err = h.waitEffects(waitCtx, n)
		m.last.Store(time.Now().UnixNano())
		res.Notes += "; throughput counted until the subscriber's last commit, latency until the ack"
	}
	meas.stop(&res)
	if err == nil && isFailingVariant(id) {
		err = h.waitEffects(waitCtx, n) // the failing ones too, before the checks
	}
	quiet.Store(true) // subscribers log their cancelled queries at shutdown
	_ = router.Close()
	cancel()
	h.drain("router", routerErr)
	quiet.Store(false)
	if err != nil {
		return res, err
	}
	el := m.elapsed()
	res.Seconds = el.Seconds()
	res.MsgsPerSec = float64(res.Messages) / el.Seconds()
	p50, p99 := percentiles(m.lat)
	res.P50ms, res.P99ms = ms(p50), ms(p99)
	if e := m.errs.Load(); e > 0 {
		res.Notes += fmt.Sprintf("; %d handler errors (redelivered)", e)
	}
	if d := m.redelivered.Load(); d > 0 {
		res.Notes += fmt.Sprintf("; %d redeliveries of finished messages (counted once)", d)
	}
	for _, d := range describe {
		d()
	}
	for _, c := range cleanup {
		c()
	}
	cleanup = nil
	err = h.verify(ctx, &res, consumer, wantEffects, wantClaims, id == B5Ingest) // before res is read for the return
	return res, err
}

// waitEffects waits until n business rows are committed.
func (h *harness) waitEffects(ctx context.Context, n int) error {
	q := `SELECT count(*) FROM ` + pgtx.QualifiedName(h.opts.schema, "bench_effects")
	for {
		var got int
		if err := h.db.QueryRowContext(ctx, q).Scan(&got); err != nil {
			return fmt.Errorf("waiting for the subscriber's commits: %w", err)
		}
		if got >= n {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// verify checks that the variant did its work once per message, then empties what it wrote.
func (h *harness) verify(ctx context.Context, res *Result, consumer string, wantEffects, wantClaims int, inboxRows bool) error {
	q := func(t string) string { return pgtx.QualifiedName(h.opts.schema, t) }
	count := func(query string, args ...any) int {
		var c int
		if err := h.db.QueryRowContext(ctx, query, args...).Scan(&c); err != nil {
			return -1
		}
		return c
	}
	var problems []string
	if got := count(`SELECT count(*) FROM ` + q("bench_effects")); got != wantEffects {
		problems = append(problems, fmt.Sprintf("%d business rows, want %d", got, wantEffects))
	}
	if wantClaims > 0 {
		if got := count(`SELECT count(*) FROM `+q("processed_messages")+` WHERE consumer = $1`, consumer); got != wantClaims {
			problems = append(problems, fmt.Sprintf("%d claims, want %d", got, wantClaims))
		}
	}
	if inboxRows {
		if got := count(`SELECT count(*) FROM `+q("inbox")+` WHERE consumer = $1`, consumer); got != res.Messages {
			problems = append(problems, fmt.Sprintf("%d inbox rows, want %d", got, res.Messages))
		}
	}
	if err := cleanSchema(ctx, h.db, h.opts.schema); err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("CHECK FAILED: %s", strings.Join(problems, "; "))
	}
	return nil
}

// ingestBurst measures the inbox receiver without a broker: a burst of concurrent Handle calls
// (as from many partitions at once), each returning after its row committed. It shows what the
// receiver itself can take; over a broker, ingest is bounded by how many messages the broker
// keeps in flight.
func (h *harness) ingestBurst(ctx context.Context) (Result, error) {
	n, callers := h.opts.processRows, 256
	consumer := "bench-ingest"
	res := Result{Variant: B5Ingest, Broker: "postgres", Messages: n, InFlight: callers}
	rc, err := inbox.NewReceiver(h.db, inbox.ReceiverConfig{Schema: h.opts.schema, Consumer: consumer}, h.logger)
	if err != nil {
		return res, err
	}
	msgs := batch(0, n)
	m := newMeter(n)
	var next atomic.Int64
	var wg sync.WaitGroup
	meas := h.startMeasuring("postgres-" + B5Ingest)
	for range callers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				start := time.Now()
				m.first.CompareAndSwap(0, start.UnixNano())
				if err := rc.Handle(msgs[i]); err != nil {
					m.errs.Add(1)
					continue
				}
				m.observe(msgs[i].UUID, start)
			}
		})
	}
	wg.Wait()
	meas.stop(&res)
	_ = rc.Close()
	if e := m.errs.Load(); e > 0 {
		return res, fmt.Errorf("%d Handle calls failed", e)
	}
	el := m.elapsed()
	res.Seconds, res.MsgsPerSec = el.Seconds(), float64(n)/el.Seconds()
	p50, p99 := percentiles(m.lat)
	res.P50ms, res.P99ms = ms(p50), ms(p99)
	c := rc.Counters()
	res.Notes = fmt.Sprintf("%d concurrent Handle calls, no broker; ReceiverConfig defaults (Workers 2, BatchSize 500); avg %.1f rows/statement", callers, float64(c.Stored)/float64(max(c.Batches, 1)))
	err = h.verify(ctx, &res, consumer, 0, 0, true) // before res is read for the return
	return res, err
}

// process measures the inbox processor draining n stored rows; each handler run writes the
// business row in the processing transaction. Processing does not involve the broker.
func (h *harness) process(ctx context.Context, id string) (Result, error) {
	n := h.opts.processRows
	consumer := "bench-process"
	cfg := inbox.ProcessorConfig{
		Schema: h.opts.schema, Consumer: consumer,
		Workers: h.opts.inboxWorkers, BatchSize: 2 * h.opts.inboxTxBatch, TxBatchSize: h.opts.inboxTxBatch,
		PollInterval: 50 * time.Millisecond,
	}
	res := Result{Variant: id, Broker: "postgres", Messages: n, InFlight: cfg.Workers}
	res.Notes = fmt.Sprintf("Workers %d, BatchSize %d, TxBatchSize %d; rows stored beforehand with StoreTx", cfg.Workers, cfg.BatchSize, cfg.TxBatchSize)
	q := func(t string) string { return pgtx.QualifiedName(h.opts.schema, t) }
	rc, err := inbox.NewReceiver(h.db, inbox.ReceiverConfig{Schema: h.opts.schema, Consumer: consumer}, h.logger)
	if err != nil {
		return res, err
	}
	defer rc.Close()
	for start := 0; start < n; start += 1000 {
		msgs := make([]*message.Message, 0, 1000)
		for i := start; i < min(start+1000, n); i++ {
			msgs = append(msgs, message.NewMessage(newUUID(), payload(i)))
		}
		err := pgtx.RunInTx(ctx, h.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := rc.StoreTx(ctx, tx, "bench", msgs...)
			return err
		})
		if err != nil {
			return res, err
		}
	}
	if _, err := h.db.ExecContext(ctx, `VACUUM ANALYZE `+q("inbox")); err != nil {
		return res, err
	}
	insert := `INSERT INTO ` + q("bench_effects") + ` (message_id, payload) VALUES ($1, $2)`
	handler := func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgtx.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), insert, msg.UUID, msg.Payload)
		return nil, err
	}
	if id == B7Process {
		handler = h.batchInsert()
	}
	p, err := inbox.NewProcessor(h.db, handler, cfg, h.logger)
	if err != nil {
		return res, err
	}
	meas := h.startMeasuring("postgres-" + id)
	start := time.Now()
	runErr := make(chan error, 1)
	go func() { runErr <- p.Run(ctx) }()
	deadline := time.Now().Add(h.opts.variantTimeout)
	for p.Counters().Processed < uint64(n) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	el := time.Since(start)
	meas.stop(&res)
	_ = p.Close()
	h.drain("processor", runErr)
	c := p.Counters()
	if c.Processed < uint64(n) {
		return res, fmt.Errorf("only %d of %d rows processed in %s", c.Processed, n, h.opts.variantTimeout)
	}
	res.Seconds = el.Seconds()
	res.MsgsPerSec = float64(res.Messages) / el.Seconds()
	if c.Failed > 0 || c.LeaseConflicts > 0 {
		res.Notes += fmt.Sprintf("; %d failed attempts, %d lease conflicts", c.Failed, c.LeaseConflicts)
	}
	var done int
	if err := h.db.QueryRowContext(ctx, `SELECT count(*) FROM `+q("inbox")+` WHERE consumer = $1 AND status = 'DONE'`, consumer).Scan(&done); err != nil {
		return res, err
	}
	if done != n {
		return res, fmt.Errorf("CHECK FAILED: %d DONE rows, want %d", done, n)
	}
	err = h.verify(ctx, &res, consumer, n, 0, false) // before res is read for the return
	return res, err
}
