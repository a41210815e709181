package outbox

import (
	"database/sql"
	"errors"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/replan"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/worker"
)

// RelayCounters are the relay's running totals since it was created.
type RelayCounters struct {
	Forwarded uint64 // messages published
	Rounds    uint64 // batches read
	Failures  uint64 // failed publish or database attempts (each retried)
	Rejected  uint64 // rows set aside in outbox_rejected (undecodable or refused for good)
	// Held counts rows copied into outbox_held because their topic failed; HeldTopics is how
	// many topics are held now.
	Held        uint64
	HeldTopics  int
	OtherSource uint64 // rows of other sources passed over
	Fenced      uint64 // position updates refused because another relay moved the position
	Rechecks    uint64 // short waits for transactions in progress when it asked for notifications
	Delayed     uint64 // rows set aside in outbox_delayed until due
	Paused      bool   // the active relay is paused: it publishes nothing
	Moved       bool   // the position was recorded on another cluster: it forwards nothing
	IsLeader    bool
	Listening   bool // its LISTEN connection is up: a commit wakes it
	LastRelays  time.Time
}

// Relay forwards committed outbox rows to a Watermill publisher.
//
// Guarantee: every committed row is published at least once, with the UUID and metadata it was
// stored with, in the package doc's order; nothing is dropped silently (a failing topic is held,
// a row refused for good is rejected, each logged and counted). Where it stops: the position is
// recorded after publishing, so a relay that dies in between publishes the last batch again and
// consumers must absorb copies; a clean stop (Close, ctx) still records what the broker accepted.
// One instance per Name leads (an advisory lock; standbys wait), and the fenced position update
// never moves backwards even when two believe they lead.
type Relay struct {
	db        *sql.DB
	publisher message.Publisher
	config    RelayConfig
	logger    watermill.LoggerAdapter
	tracer    trace.Tracer
	q         relayQueries
	replan    replan.Prefix // see replanned

	forwarded, rounds, failures, rejected, held, otherSource, fenced, rechecks atomic.Uint64
	heldTopics                                                                 atomic.Int64
	lastRelay                                                                  worker.Stamp
	listening                                                                  atomic.Bool

	delayed atomic.Uint64 // rows set aside in outbox_delayed (delay.go)
	paused  atomic.Bool   // the last position read found the relay paused (pause.go)
	// moved: the last check found the position recorded on another cluster (relay_origin.go);
	// movedLogged is when that was last logged (unix nanoseconds, 0: not since it was found).
	moved       atomic.Bool
	movedLogged atomic.Int64

	channel     string      // relayChannel(config.Schema)
	noListen    atomic.Bool // the driver cannot LISTEN: poll only
	testSignals relayTestSignals

	life   worker.Runner
	leader *worker.Leader
}

// relayTestSignals are the events of a relay a test can wait on (internal/testsignal): inert
// unless a test initialised them, through export_test.go, before the relay runs.
type relayTestSignals struct {
	Leading        testsignal.Signal[struct{}] // it leads: holds the lock, its position registered
	StoppedLeading testsignal.Signal[struct{}] // its lead loop ended; it gives up the lock next
	// RoundDone: a round ended without error, with the number of messages it published.
	RoundDone     testsignal.Signal[int]
	TopicHeld     testsignal.Signal[string]    // a topic failed: its rows wait in outbox_held
	TopicReleased testsignal.Signal[string]    // a held topic's rows are all out: it is released
	RowRejected   testsignal.Signal[string]    // the UUID of a row set aside in outbox_rejected
	Waiting       testsignal.Signal[relayWait] // the leading relay starts waiting
	Paused        testsignal.Signal[struct{}]  // the leading relay found itself paused and waits
	// Halted: the relay found its position moved to another cluster and forwards nothing.
	Halted testsignal.Signal[outboxops.PositionCheck]
}

// relayWait is what a relay that starts waiting waits for (relayTestSignals.Waiting).
type relayWait struct {
	Listening bool // its LISTEN connection is up: a commit wakes it
	Recheck   bool // a short wait before reading again for transactions in progress (wakeup)
}

// NewRelay returns a relay that forwards the outbox in config.Schema to publisher, which it
// does not close.
func NewRelay(db *sql.DB, publisher message.Publisher, config RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
	logger, err := setup.Component(db, "outbox: relay db is nil", &config, (*RelayConfig).setDefaults, "outbox: invalid relay config", logger)
	if err != nil {
		return nil, err
	}
	if publisher == nil {
		return nil, errors.New("outbox: relay publisher is nil: pass the broker publisher to forward to")
	}
	logger = logger.With(watermill.LogFields{"relay": config.Name})
	r := &Relay{
		db:        db,
		publisher: publisher,
		config:    config,
		logger:    logger,
		tracer:    tracing.Tracer(config.TracerProvider),
		q:         newRelayQueries(config.Schema),
		replan:    replan.For(db),
		channel:   relayChannel(config.Schema),
	}
	r.leader = &worker.Leader{
		DB: db, Key: relayLockKey(config.Schema, config.Name), Name: "Relay", Logger: logger,
		Standby: config.StandbyInterval,
		Backoff: worker.Backoff{Base: config.Backoff, Max: config.MaxBackoff},
		OnError: func(err error, wait time.Duration) {
			r.failures.Add(1)
			r.logger.Error("Relay error, retrying", err, watermill.LogFields{"backoff": wait})
		},
	}
	return r, nil
}

// Counters returns the relay's running totals.
func (r *Relay) Counters() RelayCounters {
	return RelayCounters{
		Forwarded:   r.forwarded.Load(),
		Rounds:      r.rounds.Load(),
		Failures:    r.failures.Load(),
		Rejected:    r.rejected.Load(),
		Held:        r.held.Load(),
		HeldTopics:  int(r.heldTopics.Load()),
		OtherSource: r.otherSource.Load(),
		Fenced:      r.fenced.Load(),
		Rechecks:    r.rechecks.Load(),
		Delayed:     r.delayed.Load(),
		Paused:      r.paused.Load(),
		Moved:       r.moved.Load(),
		IsLeader:    r.leader.Leading(),
		Listening:   r.listening.Load(),
		LastRelays:  r.lastRelay.Time(),
	}
}

// Name is the relay's RelayConfig.Name, the label its metrics carry.
func (r *Relay) Name() string { return r.config.Name }

// replanned puts replan.For before args, for the reads of tables whose size changes by the
// second (outbox, outbox_held, outbox_delayed): a plan cached while they were empty scans them
// whole (the read of a round: 5-7 ms instead of 0.1-0.3 at 20,000 rows; a held or delayed read
// 6-10 ms at 50,000 held or delayed rows).
func (r *Relay) replanned(args ...any) []any {
	return r.replan.Args(args...)
}
