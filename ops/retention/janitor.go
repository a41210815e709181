package retention

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/claims"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Report says what one round deleted (rows, unless named otherwise), as Counters does.
type Report struct {
	Claims, InboxRows                       int64
	ClaimsByConsumer, InboxRowsByConsumer   map[string]int64
	DailyPartitionsDropped                  int64 // days
	DailyPartitionsCreated                  int64 // days created ahead
	OutboxRows, OutboxRejected, SentIntents int64
	HTTPKeys                                int64 // stored httpidem responses
	Duration                                time.Duration
}

// Counters are a janitor's running totals since it was created, for metrics.
type Counters struct {
	Claims                 uint64 // rows deleted from processed_messages
	DailyPartitionsDropped uint64 // days of processed_messages_daily dropped
	InboxRows              uint64 // finished inbox rows deleted
	OutboxRows             uint64 // relayed outbox rows deleted
	HTTPKeys               uint64 // stored HTTP responses deleted
	OutboxRejected         uint64 // rejected outbox rows deleted
	SentIntents            uint64 // SENT intents deleted
	Rounds                 uint64 // rounds finished (with or without errors)
	FailedRounds           uint64 // rounds in which some step failed
	IsLeader               bool   // Run holds the leadership lock right now
	LastRound              time.Time
}

// Janitor deletes expired rows on a schedule: a claim is kept at least its consumer's Keep
// after it was applied (see the package doc for what that protects and where it stops).
type Janitor struct {
	db       *sql.DB
	config   Config
	logger   watermill.LoggerAdapter
	warnings []string
	inboxOps *inbox.Ops

	claims, dailyDropped, inboxRows, outboxRows, httpKeys, rejected, intents, rounds, failedRounds atomic.Uint64
	lastRound                                                                                      worker.Stamp

	life        worker.Runner
	leader      *worker.Leader
	testSignals janitorTestSignals
}

// janitorTestSignals are the events this package's tests wait on instead of polling (see
// internal/testsignal): inert unless a test initialised them through export_test.go.
type janitorTestSignals struct {
	Leading       testsignal.Signal[struct{}] // Run took the leadership lock; its first round follows
	LeadFailed    testsignal.Signal[error]    // an error ended the lead (or kept Run from taking it); Counters.IsLeader is false again
	RoundFinished testsignal.Signal[Report]   // a round (of Run or RunOnce) finished, with what it deleted
}

// NewJanitor validates config and returns a janitor; it does not touch the database. It logs
// an error for every Keep shorter than its declared RedeliveryHorizon (see Warnings).
func NewJanitor(db *sql.DB, config Config, logger watermill.LoggerAdapter) (*Janitor, error) {
	logger, err := setup.Component(db, "retention: db is nil: open one with pgtx.Open", &config, (*Config).setDefaults, "retention: invalid config", logger)
	if err != nil {
		return nil, err
	}
	logger = logger.With(watermill.LogFields{"component": "retention", "schema": config.Schema})
	inboxOps, err := inbox.NewOps(db, inbox.OpsConfig{Schema: config.Schema}, logger)
	if err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	j := &Janitor{
		inboxOps: inboxOps,
		db:       db,
		config:   config,
		logger:   logger,
		warnings: config.warnings(),
	}
	j.leader = &worker.Leader{
		DB: db, Key: worker.LockKey("retention", config.Schema), Name: "Janitor", Logger: logger,
		Standby: config.PollInterval,
		Backoff: worker.Backoff{Base: config.PollInterval, Max: config.PollInterval},
		OnError: func(err error, wait time.Duration) {
			logger.Error("Janitor lost or could not take leadership, retrying", err, watermill.LogFields{"retry_in": wait})
			j.testSignals.LeadFailed.Signal(err)
		},
	}
	for _, w := range j.warnings {
		logger.Error("RETENTION TOO SHORT: "+w, errRetentionBelowHorizon, nil)
	}
	return j, nil
}

var errRetentionBelowHorizon = errors.New("retention window shorter than the declared redelivery horizon")

// Warnings returns the warnings NewJanitor logged, one per window below its horizon.
func (j *Janitor) Warnings() []string { return append([]string(nil), j.warnings...) }

// Config returns the configuration in force, defaults filled in.
func (j *Janitor) Config() Config { return j.config }

// Counters returns the janitor's running totals.
func (j *Janitor) Counters() Counters {
	return Counters{
		Claims:                 j.claims.Load(),
		DailyPartitionsDropped: j.dailyDropped.Load(),
		InboxRows:              j.inboxRows.Load(),
		OutboxRows:             j.outboxRows.Load(),
		HTTPKeys:               j.httpKeys.Load(),
		OutboxRejected:         j.rejected.Load(),
		SentIntents:            j.intents.Load(),
		Rounds:                 j.rounds.Load(),
		FailedRounds:           j.failedRounds.Load(),
		IsLeader:               j.leader.Leading(),
		LastRound:              j.lastRound.Time(),
	}
}

// Run deletes expired rows every PollInterval until ctx ends or Close is called (then nil).
// One instance per schema leads (an advisory lock); the others take over within a
// PollInterval. Errors are logged and counted (Counters.FailedRounds). One Run at a time.
func (j *Janitor) Run(ctx context.Context) error {
	return j.life.Run(ctx, func(ctx context.Context) error { return j.leader.Run(ctx, j.lead) })
}

// lead runs rounds while this instance holds the leadership lock on conn (see worker.Leader).
func (j *Janitor) lead(ctx context.Context, conn *sql.Conn) error {
	j.testSignals.Leading.Signal(struct{}{})
	for {
		// The lock lives as long as this session: a query that succeeds on it proves it is
		// still ours. If the connection broke, the server released the lock and another
		// instance may lead now; stop before deleting anything more.
		if _, err := conn.ExecContext(ctx, `SELECT 1`); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("retention: leadership connection lost: %w", err)
		}
		if _, err := j.RunOnce(ctx); err != nil && ctx.Err() == nil {
			j.logger.Error("Janitor round failed in part; the next round tries again", err, nil)
		}
		if !worker.Sleep(ctx, j.config.PollInterval) {
			return nil
		}
	}
}

// Close stops Run and waits for it to return; idempotent and final.
func (j *Janitor) Close() error { return j.life.Close() }

// RunOnce runs one round now, beside a leader if there is one (two rounds share the work),
// and reports what it deleted. A failing step does not stop the others; the error joins them.
func (j *Janitor) RunOnce(ctx context.Context) (Report, error) {
	start := time.Now()
	rep := Report{ClaimsByConsumer: map[string]int64{}}
	var now time.Time
	if err := j.db.QueryRowContext(ctx, `SELECT now()`).Scan(&now); err != nil {
		j.finishRound(start, &rep, err)
		return rep, fmt.Errorf("retention: read database clock: %w", err)
	}
	var errs []error
	step := func(name string, fn func() error) {
		if ctx.Err() != nil {
			return
		}
		if err := fn(); err != nil {
			err = fmt.Errorf("retention: %s: %w", name, hint(err))
			errs = append(errs, err)
			j.logger.Error("Retention step failed", err, watermill.LogFields{"step": name})
		}
	}
	step("claims", func() error { return j.deleteClaims(ctx, now, &rep) })
	step("daily partitions", func() error { return j.maintainPartitions(ctx, now, &rep) })
	step("inbox", func() error { return j.deleteInbox(ctx, now, &rep) })
	var slots []string
	step("cdc slot positions", func() (err error) {
		slots, err = j.slotsToAdvance(ctx)
		return err
	})
	for _, slot := range slots {
		step("cdc slot position "+slot, func() error {
			_, err := outboxops.AdvanceSlotPosition(ctx, j.db, j.config.Schema, slot)
			return err
		})
	}
	step("outbox", func() error { return j.prune(ctx, outbox.Prune, j.config.OutboxKeep, &rep.OutboxRows, &j.outboxRows) })
	if j.config.HTTPKeysKeep > 0 {
		step("http idempotency keys", func() error { return j.prune(ctx, httpidem.Prune, j.config.HTTPKeysKeep, &rep.HTTPKeys, &j.httpKeys) })
	}
	if j.config.OutboxRejectedKeep > 0 {
		step("rejected outbox rows", func() error {
			return j.prune(ctx, outbox.PruneRejected, j.config.OutboxRejectedKeep, &rep.OutboxRejected, &j.rejected)
		})
	}
	if j.config.SentIntentsKeep > 0 {
		step("sent intents", func() error {
			return j.prune(ctx, intent.PruneSent, j.config.SentIntentsKeep, &rep.SentIntents, &j.intents)
		})
	}
	if ctx.Err() != nil {
		errs = append(errs, fmt.Errorf("retention: round interrupted: %w", context.Cause(ctx)))
	}
	err := errors.Join(errs...)
	j.finishRound(start, &rep, err)
	return rep, err
}

// slotsToAdvance is every slot whose position is registered in the outbox, and those of
// CDCSlots: a position nobody advances holds every later outbox row back, so a registered one
// is advanced whether it is listed or not, and a listed one that is not registered fails its
// step (ErrSlotPositionNotRegistered) instead of being passed over.
func (j *Janitor) slotsToAdvance(ctx context.Context) ([]string, error) {
	registered, err := outboxops.SlotPositions(ctx, j.db, j.config.Schema)
	if err != nil {
		return slices.Clone(j.config.CDCSlots), err // the listed ones still go ahead
	}
	slots := append(slices.Clone(j.config.CDCSlots), registered...)
	slices.Sort(slots)
	return slices.Compact(slots), nil
}

func (j *Janitor) finishRound(start time.Time, rep *Report, err error) {
	rep.Duration = time.Since(start)
	j.rounds.Add(1)
	if err != nil {
		j.failedRounds.Add(1)
	}
	j.lastRound.SetNow()
	if rep.Claims+rep.DailyPartitionsDropped+rep.InboxRows+rep.OutboxRows+rep.HTTPKeys+rep.OutboxRejected+rep.SentIntents > 0 {
		j.logger.Info("Retention round deleted rows", watermill.LogFields{
			"claims": rep.Claims, "daily_partitions_dropped": rep.DailyPartitionsDropped,
			"inbox_rows": rep.InboxRows, "outbox_rows": rep.OutboxRows, "http_keys": rep.HTTPKeys,
			"outbox_rejected": rep.OutboxRejected, "sent_intents": rep.SentIntents,
			"duration": rep.Duration,
		})
	}
	j.testSignals.RoundFinished.Signal(*rep)
}

// hint adds what to do to the errors an operator will meet first.
func hint(err error) error {
	if pgtx.IsUndefinedTable(err) {
		return fmt.Errorf("%w (a watermill-once table is missing: run the migrations, `wmonce migrate up`)", err)
	}
	return err
}

// The steps below call the owners' operations: retention holds no SQL on their tables.

func (j *Janitor) deleteClaims(ctx context.Context, now time.Time, rep *Report) error {
	consumers, err := claims.ClaimConsumers(ctx, j.db, j.config.Schema)
	if err != nil {
		return err
	}
	for _, c := range consumers {
		n, err := once.PruneClaims(ctx, j.db, j.config.Schema, pgtx.PruneRequest{Consumer: c, Before: now.Add(-j.config.policy(c).Keep), BatchSize: j.config.BatchSize})
		if n > 0 {
			rep.Claims += n
			rep.ClaimsByConsumer[c] += n
			j.claims.Add(uint64(n))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// maintainPartitions drops the days of processed_messages_daily older than the longest Keep
// (the table is shared by every consumer) and creates PartitionsAhead days ahead.
func (j *Janitor) maintainPartitions(ctx context.Context, now time.Time, rep *Report) error {
	days, err := once.MaintainDays(ctx, j.db, j.config.Schema, now.Add(-j.config.longestKeep()), now, j.config.PartitionsAhead)
	rep.DailyPartitionsDropped += int64(len(days.Dropped))
	rep.DailyPartitionsCreated += int64(days.Created)
	j.dailyDropped.Add(uint64(len(days.Dropped)))
	for _, d := range days.Dropped {
		j.logger.Info("Dropped expired day of claims", watermill.LogFields{"day": d.Format(time.DateOnly)})
	}
	return err
}

func (j *Janitor) deleteInbox(ctx context.Context, now time.Time, rep *Report) error {
	consumers, err := j.inboxOps.Consumers(ctx)
	if err != nil {
		return err
	}
	rep.InboxRowsByConsumer = map[string]int64{}
	for _, c := range consumers {
		n, err := j.deleteFinishedInbox(ctx, c, now.Add(-j.config.inboxKeep(c)))
		if n > 0 {
			rep.InboxRows += n
			rep.InboxRowsByConsumer[c] += n
			j.inboxRows.Add(uint64(n))
		}
		if err != nil {
			return fmt.Errorf("consumer %q: %w", c, err)
		}
	}
	return nil
}

// deleteFinishedInbox deletes one consumer's finished rows through the inbox's own
// operation, so that what "finished" means is defined in one place.
func (j *Janitor) deleteFinishedInbox(ctx context.Context, consumer string, before time.Time) (int64, error) {
	return inbox.PruneFinished(ctx, j.db, j.config.Schema, pgtx.PruneRequest{Consumer: consumer, Before: before, BatchSize: j.config.BatchSize})
}

// pruneFunc is the signature every owner's Prune shares.
type pruneFunc func(ctx context.Context, db *sql.DB, schema string, req pgtx.PruneRequest) (int64, error)

// prune runs an owner's Prune with keep and adds what it deleted to the round's report field
// and the janitor's running total.
func (j *Janitor) prune(ctx context.Context, fn pruneFunc, keep time.Duration, reported *int64, total *atomic.Uint64) error {
	n, err := fn(ctx, j.db, j.config.Schema, pgtx.PruneRequest{Keep: keep, BatchSize: j.config.BatchSize})
	*reported += n
	total.Add(uint64(n))
	return err
}
