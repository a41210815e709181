package intent

import (
	"context"
	"database/sql"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/replan"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/worker"
)

// SenderCounters are a Sender's running totals.
type SenderCounters struct {
	Sent       uint64 // intents the provider confirmed
	Retried    uint64 // sends that failed with NotSent and were put back with backoff
	Unknown    uint64 // sends with an unknown outcome, handed to the channel's policy
	Failed     uint64 // intents parked as FAILED
	Skipped    uint64 // intents parked as SKIPPED
	Recovered  uint64 // intents found in SENDING after their lease ran out
	Reconciled uint64 // recovered intents the provider's lookup confirmed (not sent again)
	LeaseLost  uint64 // outcomes not recorded because another sender had taken the intent over
	Released   uint64 // intents given back at shutdown (see Sender.Close)
	Errors     uint64 // database errors (retried)
}

// Sender sends recorded intents through the channels' providers, at least once each (see the
// package doc). Any number of Senders may share a table.
type Sender struct {
	db       *sql.DB
	config   SenderConfig
	logger   watermill.LoggerAdapter
	tracer   trace.Tracer
	channels []string

	q      senderQueries
	replan replan.Prefix // before the claims' arguments

	sent, retried, unknown, failed, skipped, recovered, reconciled, leaseLost, released, errs atomic.Uint64

	life        worker.Runner
	testSignals senderTestSignals
}

// senderTestSignals are the events this package's tests wait on instead of polling (see
// internal/testsignal): inert unless a test initialised them through export_test.go. Each
// intent event comes once its state is recorded, with the intent as the sender last saw it.
type senderTestSignals struct {
	Sent     testsignal.Signal[Intent] // counted in Sent: the provider confirmed it, or a lookup found it
	Parked   testsignal.Signal[Intent] // counted in Failed or Skipped; Status and LastError say which and why
	Released testsignal.Signal[Intent] // counted in Released: given back by a stopping sender (Status says where)
	// RoundFinished comes when a worker of Run found nothing ready to take and starts waiting
	// PollInterval, with the number of intents it took since it last waited.
	RoundFinished testsignal.Signal[int]
}

// NewSender validates config and returns a Sender; it does not touch the database.
func NewSender(db *sql.DB, config SenderConfig, logger watermill.LoggerAdapter) (*Sender, error) {
	channels := make(map[string]Channel, len(config.Channels))
	for k, v := range config.Channels {
		channels[k] = v
	}
	config.Channels = channels // setDefaults fills in the copy, not the caller's map
	logger, err := setup.Component(db, "intent: db is nil: open one with pgtx.Open", &config, (*SenderConfig).setDefaults, "intent: invalid sender config", logger)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(channels))
	for name := range channels {
		names = append(names, name)
	}
	sort.Strings(names)
	return &Sender{
		db:       db,
		config:   config,
		logger:   logger,
		tracer:   tracing.Tracer(config.TracerProvider),
		channels: names,
		q:        newSenderQueries(config.Schema),
		replan:   replan.For(db),
	}, nil
}

// Counters returns the running totals.
func (s *Sender) Counters() SenderCounters {
	return SenderCounters{
		Sent: s.sent.Load(), Retried: s.retried.Load(), Unknown: s.unknown.Load(), Failed: s.failed.Load(),
		Skipped: s.skipped.Load(), Recovered: s.recovered.Load(), Reconciled: s.reconciled.Load(),
		LeaseLost: s.leaseLost.Load(), Released: s.released.Load(), Errors: s.errs.Load(),
	}
}

// Channels returns the names of the channels this Sender works, sorted.
func (s *Sender) Channels() []string { return slices.Clone(s.channels) }

// Close stops Run and waits for it; idempotent and final. Stopping (also a cancelled context)
// gives the intent in flight back at once: PENDING if certainly not sent, else SENDING with
// its lease ended, for the next sender's CrashPolicy (never a plain resend).
func (s *Sender) Close() error { return s.life.Close() }

// Run sends intents until ctx ends or Close is called (nil on a clean stop), retrying database
// errors. One Run at a time.
func (s *Sender) Run(ctx context.Context) error {
	return s.life.Run(ctx, func(ctx context.Context) error {
		var wg sync.WaitGroup
		for range s.config.Workers {
			wg.Go(func() { s.work(ctx) })
		}
		wg.Wait()
		return nil
	})
}

func (s *Sender) work(ctx context.Context) {
	backoff := worker.Backoff{Base: s.config.Backoff, Max: s.config.MaxBackoff}
	taken := 0
	for ctx.Err() == nil {
		did, err := s.SendNext(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			wait := backoff.Next()
			s.logger.Error("Intent sender database error, retrying", err, watermill.LogFields{"backoff": wait})
			if !worker.Sleep(ctx, wait) {
				return
			}
		case !did:
			backoff.Reset()
			s.testSignals.RoundFinished.Signal(taken)
			taken = 0
			if !worker.Sleep(ctx, s.config.PollInterval) {
				return
			}
		default:
			backoff.Reset()
			taken++
		}
	}
}

// SendOnce works intents until none is ready and returns how many (for own scheduling).
func (s *Sender) SendOnce(ctx context.Context) (int, error) {
	n := 0
	for {
		did, err := s.SendNext(ctx)
		if err != nil || !did {
			return n, err
		}
		n++
	}
}

// SendNext carries one intent to its next state (one whose lease ran out first, else the
// oldest ready PENDING one) and reports whether it found one. Errors are the database's.
func (s *Sender) SendNext(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	in, token, err := s.claim(ctx, s.q.claimStuck)
	if err != nil {
		return false, err
	}
	recovered := in != nil
	if !recovered {
		if in, token, err = s.claim(ctx, s.q.claimPending); err != nil || in == nil {
			return false, err
		}
	}
	return true, s.process(ctx, *in, token, recovered)
}
