package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/pgnotify"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Schema holds the outbox tables. Default pgtx.DefaultSchema.
	Schema string
	// Name identifies this relay's position in outbox_offsets (a consumer group). Relays with
	// the same name share one position and elect one active instance; relays with different
	// names each forward every row of their Source (e.g. one to Kafka, one to an audit sink).
	// A name serves one Source: a relay whose Source differs from the one its name was
	// registered with refuses to run (ErrRelaySource). Default "relay".
	Name string
	// Source selects the rows this relay forwards: those whose Writer had the same
	// Config.Source. Rows of other sources are passed over (RelayCounters.OtherSource), left to
	// the relays of their own source, so that services sharing one database and schema each
	// forward their own messages only. Default "": rows written without a source (every row
	// written before migration 012). Rows of a source no relay serves are kept by Prune, and
	// every relay that passes over them logs that at error level.
	Source string
	// BatchSize is the most rows read and published per batch (a round of the relay's order,
	// see the package doc, spans as many batches as it needs). Each batch also reads and
	// writes the position (a commit of its own), so small batches cost throughput: measured
	// with go run ./e2e/bench, 1000 forwards 2.5-3.4x more messages per second than 100 to Kafka,
	// RabbitMQ and SQL alike. After a crash, at most one batch is published again. Default 1000.
	BatchSize int
	// PollInterval is the fallback wait of an idle relay. The active relay LISTENs on the
	// schema's channel, and while it is idle the Writer notifies it at every commit that stores
	// messages (package doc, Waking up), so it wakes when they commit. Polling covers only what
	// a notification cannot: a LISTEN connection being re-established or dropped silently, a
	// transaction that stored its rows just as the relay went idle, a row inserted by something
	// other than the Writer, and LISTEN being off (DisableListen, or a *sql.DB whose driver is
	// not pgx's stdlib: then set it lower). An idle relay sends two statements per
	// PollInterval. Default 1s.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY off: the relay then only polls, reading again at once
	// after every round that published and waiting PollInterval after an empty one, and
	// Writers are never asked to notify it.
	DisableListen bool
	// Backoff is the first wait after a failed publish or database error; it doubles up
	// to MaxBackoff, each wait drawn between half and all of that value (jitter). Default
	// 100ms and 5s.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// StandbyInterval is how often a relay that is not the active one tries to take over.
	// Default 1s.
	StandbyInterval time.Duration

	// PublishLanes > 1 publishes each batch over that many concurrent Publish calls, one per
	// lane, to publishers that gain from concurrency: watermill-kafka's own publisher sends one
	// message per request and waits for it, but concurrent calls are batched by its producer
	// (the broker package's Kafka publisher already sends a call's messages together).
	// Messages are assigned to lanes by LaneKey, and each lane publishes its messages in the
	// relay's order (see the package doc, Order), so messages with the same key keep their
	// order; messages with different keys may reach the broker in another order. The position
	// still advances only after every lane of the batch has published. Default 1: one Publish
	// call per run of rows with the same topic, in the relay's order.
	PublishLanes int
	// LaneKey returns the ordering key of a message for PublishLanes. Default: the
	// DefaultLaneKeyField metadata (the broker package's Kafka partition key), else the UUID.
	// Use the key that decides your broker's partition or queue, so that what the broker keeps
	// in order is published in order.
	LaneKey func(topic string, msg *message.Message) string

	// IsPermanent tells a publish error that refuses the messages for good (publishing the
	// same message again cannot succeed: an invalid topic, a message too large, metadata the
	// broker reserves) from a transient one. A message refused for good is set aside in
	// outbox_rejected with the error, for an operator to republish (RepublishRejected), and
	// the relay goes on with the rows behind it; when a call of several messages is refused
	// for good, they are published again one by one to find which. Default
	// wmonce.IsPermanent: the errors a publisher marked with wmonce.Permanent, as the
	// broker package's publishers mark the refusals they recognise (for another publisher,
	// pass broker.IsPermanentPublishError or your own). Whatever it says, a cancelled
	// context, a timeout and a connection error are never permanent.
	IsPermanent func(err error) bool

	// TracerProvider traces publishing: each message that carries trace context (stamped by
	// the Writer) is published under an "outbox relay publish" span (kind producer), a child
	// of and linked to the producer's span, one per publish attempt (a failed attempt ends
	// its span with the error; a held row's next attempt starts another), and set in the message's
	// context, so a tracing publisher decorator nests under it. The message's metadata keeps
	// the producer's context, so the consumer continues that trace. Messages without trace
	// context are published untraced. Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// DefaultLaneKeyField is the metadata field the default LaneKey reads; it is the broker
// package's default Kafka partition key field.
const DefaultLaneKeyField = "partition_key"

// MaxPublishLanes is the largest PublishLanes accepted.
const MaxPublishLanes = 256

func defaultLaneKey(_ string, msg *message.Message) string {
	if v := msg.Metadata.Get(DefaultLaneKeyField); v != "" {
		return v
	}
	return msg.UUID
}

func (c *RelayConfig) setDefaults() {
	if c.Schema == "" {
		c.Schema = pgtx.DefaultSchema
	}
	if c.Name == "" {
		c.Name = "relay"
	}
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.Backoff == 0 {
		c.Backoff = 100 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.StandbyInterval == 0 {
		c.StandbyInterval = time.Second
	}
	if c.PublishLanes == 0 {
		c.PublishLanes = 1
	}
	if c.LaneKey == nil {
		c.LaneKey = defaultLaneKey
	}
	if c.IsPermanent == nil {
		c.IsPermanent = wmonce.IsPermanent
	}
}

// Validate reports a configuration that cannot work.
func (c RelayConfig) Validate() error {
	var errs []error
	if err := pgtx.ValidateIdentifier("schema", c.Schema); err != nil {
		errs = append(errs, err)
	}
	if err := wmonce.CheckName("relay Name", c.Name); err != nil {
		errs = append(errs, err)
	}
	if err := checkSource(c.Source); err != nil {
		errs = append(errs, err)
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		errs = append(errs, fmt.Errorf("BatchSize must be between 1 and 10000, got %d", c.BatchSize))
	}
	if c.PollInterval < 0 || c.Backoff < 0 || c.MaxBackoff < c.Backoff || c.StandbyInterval < 0 {
		errs = append(errs, errors.New("intervals must be positive and MaxBackoff >= Backoff"))
	}
	if c.PublishLanes < 1 || c.PublishLanes > MaxPublishLanes {
		errs = append(errs, fmt.Errorf("PublishLanes must be between 1 and %d, got %d", MaxPublishLanes, c.PublishLanes))
	}
	return errors.Join(errs...)
}

// RelayCounters are the relay's running totals since it was created.
type RelayCounters struct {
	Forwarded uint64 // messages published
	Rounds    uint64 // batches read
	Failures  uint64 // failed publish or database attempts (each retried)
	// Rejected counts rows set aside in outbox_rejected: rows that could not be decoded, and
	// rows the publisher refused for good (RelayConfig.IsPermanent).
	Rejected uint64
	// Held counts rows copied into outbox_held because their topic was failing; HeldTopics is
	// how many topics are held right now (their rows wait there, the other topics go on).
	Held       uint64
	HeldTopics int
	// OtherSource counts rows of other sources passed over (RelayConfig.Source).
	OtherSource uint64
	Fenced      uint64 // position updates refused because another relay moved the position
	// Rechecks counts the short waits of a relay that had just asked for notifications, for
	// transactions in progress at that moment (they may have stored rows without notifying).
	Rechecks uint64
	IsLeader bool
	// Listening is true while the active relay's LISTEN connection is up: it then wakes when a
	// Writer's transaction commits, not after PollInterval.
	Listening  bool
	LastRelays time.Time
}

// Relay forwards committed outbox rows to a Watermill publisher.
//
// Guarantee: every committed row is published at least once, with the UUID and metadata it was
// stored with. Order (detailed in the package doc): round by round, each round being the
// transactions that committed since the previous one, in insertion order within the round. A
// transaction that committed before another is published after it only if both fall in one
// round and it inserted its outbox rows after the other did. Producers of a key that serialise
// on a lock and write their outbox rows after taking it are therefore published in commit
// order. The position is recorded after publishing, so a relay that dies between publishing and
// recording publishes the same rows again: consumers must absorb copies (the effectively-once
// middleware does). A relay stopped by Close or its context still records the batch the broker
// accepted (waiting up to 5s for that update), so a clean stop republishes nothing.
//
// Failures (package doc, When the broker refuses): a topic the publisher fails for (a
// transient error: a topic that does not exist, a broker that does not answer) is held: its
// rows are copied into outbox_held and published from there, in order, with backoff, while the
// rows of every other topic go on; the topic's later rows wait behind them until none is left.
// A row the publisher refuses for good (RelayConfig.IsPermanent) and a row that cannot be
// decoded are copied into outbox_rejected with the reason, and the rows behind them go on,
// later rows of the same key included. Every hold and every rejection is logged at error level
// and counted (RelayCounters); nothing is dropped silently.
//
// Wake-ups (package doc, Waking up): the active relay LISTENs on the schema's channel and
// polls every PollInterval only as a fallback. It uses two connections of the pool: one for its
// lock and reads, one for LISTEN. A lost LISTEN connection is logged, counted in Failures and
// re-established with backoff; meanwhile the relay polls, and it runs a round as soon as LISTEN
// is back.
//
// One active instance per Name: the relay holds a session-level advisory lock while active;
// standbys poll for it. The position update is fenced (compare-and-set), so even two instances
// that both believe they lead never move the position backwards.
//
// The position is a snapshot (outbox_offsets.snapshot), plus the round in progress when a round
// spans several batches. A row is published in the first round after its transaction commits;
// a long transaction elsewhere on the server does not delay it.
type Relay struct {
	db        *sql.DB
	publisher message.Publisher
	config    RelayConfig
	logger    watermill.LoggerAdapter
	tracer    trace.Tracer

	qRegister, qSourceOf, qServed, qPosition, qPositionIdle, qReadRound, qReadRest, qAdvance, qReject string
	qHold, qHeldTopics, qHeldRead, qHeldDelete                                                        string

	forwarded, rounds, failures, rejected, held, otherSource, fenced, rechecks atomic.Uint64
	heldTopics                                                                 atomic.Int64
	lastRelay                                                                  atomic.Int64
	listening                                                                  atomic.Bool

	channel  string      // relayChannel(config.Schema)
	noListen atomic.Bool // the driver cannot LISTEN: poll only
	idleHook func()      // tests: called each time the relay starts waiting

	life   worker.Runner
	leader *worker.Leader
}

// NewRelay returns a relay that forwards the outbox in config.Schema to publisher. The
// publisher is not closed by the relay.
func NewRelay(db *sql.DB, publisher message.Publisher, config RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
	logger, err := setup.Component(db, "outbox: relay db is nil", &config, (*RelayConfig).setDefaults, "outbox: invalid relay config", logger)
	if err != nil {
		return nil, err
	}
	if publisher == nil {
		return nil, errors.New("outbox: relay publisher is nil: pass the broker publisher to forward to")
	}
	table := pgtx.QualifiedName(config.Schema, "outbox")
	offsets := pgtx.QualifiedName(config.Schema, "outbox_offsets")
	logger = logger.With(watermill.LogFields{"relay": config.Name})
	r := &Relay{
		db:        db,
		publisher: publisher,
		config:    config,
		logger:    logger,
		channel:   relayChannel(config.Schema),
		tracer:    tracing.Tracer(config.TracerProvider),
		// Registers the position for the relay's Source ($2) and returns the Source the position
		// belongs to: a new one is this relay's, one registered before migration 012 (NULL) is
		// adopted. NULL when a concurrent registration is not visible to the statement yet.
		qRegister: `WITH ins AS (
    INSERT INTO ` + offsets + ` (consumer_group, offset_acked, last_processed_transaction_id, snapshot, source)
    VALUES ($1, 0, '1', '` + emptySnapshot + `', $2) ON CONFLICT DO NOTHING RETURNING source),
adopt AS (UPDATE ` + offsets + ` SET source = $2 WHERE consumer_group = $1 AND source IS NULL RETURNING source)
SELECT coalesce((SELECT source FROM ins), (SELECT source FROM adopt), (SELECT source FROM ` + offsets + ` WHERE consumer_group = $1))`,
		qSourceOf: `SELECT source FROM ` + offsets + ` WHERE consumer_group = $1`,
		// Whether some relay forwards source $1 (a relay older than migration 012 forwards all).
		qServed:   `SELECT EXISTS (SELECT 1 FROM ` + offsets + ` WHERE source IS NULL OR source = $1)`,
		qPosition: `SELECT snapshot::text, target_snapshot::text, target_offset FROM ` + offsets + ` WHERE consumer_group = $1`,
		// The position read of an idle relay's round also asks Writers to notify it until
		// idle_until ($2 microseconds from now, renewed by every idle round). It commits before
		// the round reads the outbox, so a transaction that stores after it notifies, and one that
		// committed before it is read by this round.
		qPositionIdle: `UPDATE ` + offsets + ` SET idle_until = now() + $2::bigint * interval '1 microsecond'
WHERE consumer_group = $1 RETURNING snapshot::text, target_snapshot::text, target_offset`,
		// One statement takes the snapshot and reads with it: pg_current_snapshot() returns the
		// statement's active snapshot, the one its scans see, so the rows read are exactly the
		// transactions visible now and not in prev ($1): those in prev's in-progress list, and
		// those from prev's xmax up to the current xmax. Each branch is a range of the
		// (transaction_id, offset) primary key, bounded on both sides so that a generic plan
		// estimates it small too; "offset" + 0 keeps the planner from walking the whole outbox
		// in "offset" order instead. Only the keys of the round are sorted; the rows are read
		// for the batch alone. A round with no rows still returns one (offset NULL) carrying
		// the snapshot: its in-progress list tells an idle relay whom to wait for (lead). Rows of
		// another source than $3 are returned without payload: the relay only passes over them.
		qReadRound: `SELECT cur.snap, t."offset", t.transaction_id::text, t.uuid, t.source,
    CASE WHEN t.source = $3 THEN t.payload::text END, CASE WHEN t.source = $3 THEN t.metadata::text END
FROM (SELECT pg_current_snapshot()::text AS snap) cur
LEFT JOIN (
    SELECT t."offset", t.transaction_id, t.uuid, t.source, t.payload, t.metadata
    FROM (
        SELECT "offset", transaction_id FROM (
            SELECT "offset", transaction_id FROM ` + table + `
            WHERE transaction_id = ANY(ARRAY(SELECT pg_snapshot_xip($1::text::pg_snapshot)))
            UNION ALL
            SELECT "offset", transaction_id FROM ` + table + `
            WHERE transaction_id >= pg_snapshot_xmax($1::text::pg_snapshot)
              AND transaction_id < pg_snapshot_xmax(pg_current_snapshot())
        ) round
        ORDER BY "offset" + 0
        LIMIT $2
    ) batch
    JOIN ` + table + ` t ON t.transaction_id = batch.transaction_id AND t."offset" = batch."offset"
) t ON true
ORDER BY t."offset"`,
		// The rest of a round larger than one batch: visible in target ($2), not in prev ($1),
		// after the last offset published ($3). Walks the "offset" index (migration 006).
		qReadRest: `SELECT "offset", transaction_id::text, uuid, source,
    CASE WHEN source = $5 THEN payload::text END, CASE WHEN source = $5 THEN metadata::text END
FROM ` + table + `
WHERE "offset" > $3
  AND (transaction_id = ANY(ARRAY(SELECT pg_snapshot_xip($1::text::pg_snapshot)))
       OR transaction_id >= pg_snapshot_xmax($1::text::pg_snapshot))
  AND transaction_id < pg_snapshot_xmax($2::text::pg_snapshot)
  AND pg_visible_in_snapshot(transaction_id, (SELECT $2::text::pg_snapshot))
ORDER BY "offset"
LIMIT $4`,
		// Compare-and-set on the whole position. The legacy columns keep a conservative
		// watermark for older readers: every row below pg_snapshot_xmin(snapshot) is published.
		// A position update after a publish also withdraws the relay's request for notifications
		// ($8): a relay that publishes is busy, and asks again once it finds nothing.
		qAdvance: `UPDATE ` + offsets + ` SET snapshot = $2::text::pg_snapshot, target_snapshot = $3::text::pg_snapshot,
    target_offset = $4, last_processed_transaction_id = pg_snapshot_xmin($2::text::pg_snapshot), offset_acked = 0,
    idle_until = CASE WHEN $8 THEN NULL ELSE idle_until END
WHERE consumer_group = $1 AND snapshot::text = $5
  AND target_snapshot::text IS NOT DISTINCT FROM $6 AND target_offset IS NOT DISTINCT FROM $7`,
		qReject: `INSERT INTO ` + pgtx.QualifiedName(config.Schema, "outbox_rejected") + ` (relay, "offset", transaction_id, uuid, payload, metadata, error, topic, source)
VALUES ($1, $2, $3::xid8, $4, $5::json, $6::json, $7, $8, $9) ON CONFLICT DO NOTHING`,
	}
	r.holdQueries(table)
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

// recordTimeout bounds the position update after a publish, which outlives a cancelled context.
const recordTimeout = 5 * time.Second

// emptySnapshot sees no transaction: the position of a relay that has published nothing.
const emptySnapshot = "1:1:"

// position is how far a relay has published, in snapshots (pg_snapshot text). Every
// transaction visible in prev is published. While a round spans several batches, target is the
// round's snapshot: the round is the rows visible in target and not in prev, and those with
// "offset" <= last are published too.
type position struct {
	prev   string
	target sql.NullString
	last   sql.NullInt64
}

type outboxRow struct {
	offset   int64
	txID     string // xid8 as text
	uuid     string
	source   string
	mine     bool // of the relay's Source: payload and metadata are read only then
	payload  string
	metadata sql.NullString
	seq      int64 // outbox_held only: the order of held rows
}

// Counters returns the relay's running totals.
func (r *Relay) Counters() RelayCounters {
	var last time.Time
	if n := r.lastRelay.Load(); n != 0 {
		last = time.Unix(0, n)
	}
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
		IsLeader:    r.leader.Leading(),
		Listening:   r.listening.Load(),
		LastRelays:  last,
	}
}

// Close stops Run and waits for it to return. It is idempotent and final: a Run after Close
// returns nil at once.
func (r *Relay) Close() error { return r.life.Close() }

// Run forwards rows until ctx is cancelled or Close is called. It returns nil on a clean stop.
// Database and publish errors are retried with backoff, never returned; the one error it
// returns is ErrRelaySource, for a Name registered by a relay of another Source, which no
// retry can fix. One Run at a time: a second concurrent Run returns an error; Run may be
// called again after it returned.
func (r *Relay) Run(ctx context.Context) error {
	return r.life.Run(ctx, func(ctx context.Context) error {
		// A standby never leads while the other Source's relay does: check before waiting for
		// the lock. Other errors are the leadership loop's to retry.
		if err := r.register(ctx, r.db); errors.Is(err, ErrRelaySource) {
			return err
		}
		ctx, stop := context.WithCancelCause(ctx)
		defer stop(nil)
		_ = r.leader.Run(ctx, func(ctx context.Context, conn *sql.Conn) error {
			err := r.lead(ctx, conn)
			if errors.Is(err, ErrRelaySource) {
				stop(err)
				return nil
			}
			return err
		})
		if err := context.Cause(ctx); errors.Is(err, ErrRelaySource) {
			return err
		}
		return nil
	})
}

// ErrRelaySource is returned by Run and RelayOnce when the relay's Name is registered in
// outbox_offsets for another Source than the relay's (RelayConfig.Source): two services that
// share a schema gave their relays one name. Give each its own RelayConfig.Name.
var ErrRelaySource = errors.New("outbox: this relay name forwards another source")

// rowQuerier is the part of *sql.DB and *sql.Conn that register uses.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// register makes sure the relay's position exists and belongs to its Source.
func (r *Relay) register(ctx context.Context, q rowQuerier) error {
	var owner sql.NullString
	err := q.QueryRowContext(ctx, r.qRegister, r.config.Name, r.config.Source).Scan(&owner)
	if err == nil && !owner.Valid { // registered concurrently: read it once it is visible
		err = q.QueryRowContext(ctx, r.qSourceOf, r.config.Name).Scan(&owner)
	}
	if err != nil {
		return fmt.Errorf("outbox: relay init position: %w", err)
	}
	if owner.Valid && owner.String != r.config.Source {
		return fmt.Errorf("%w: relay %q in schema %s forwards source %q, and this one has Source %q: give it its own RelayConfig.Name",
			ErrRelaySource, r.config.Name, r.config.Schema, owner.String, r.config.Source)
	}
	return nil
}

// lead relays while this instance holds the leadership lock on conn (see worker.Leader).
func (r *Relay) lead(ctx context.Context, conn *sql.Conn) error {
	if err := r.register(ctx, conn); err != nil {
		return err
	}
	s, err := r.newSession(ctx, conn)
	if err != nil {
		return err
	}
	defer r.heldTopics.Store(0)
	if !pgnotify.IsPgx(conn) {
		r.noListen.Store(true) // before the first round, which decides whether to wait after it
	}
	wake, stopListen := r.listen(ctx)
	defer stopListen()
	poll := time.NewTimer(r.config.PollInterval)
	defer poll.Stop()
	// ask: the next round asks the Writers to notify the relay (qPositionIdle), because the
	// previous one found nothing. A round that publishes withdraws the request (qAdvance), so
	// that producers do not pay for notifications while the relay is busy: a notifying
	// transaction takes, at commit, a lock that serialises the commits of all notifying
	// transactions on the server. The request stands while the relay waits.
	ask := false
	// A Writer decides whether to notify when it stores, so a transaction that stored before
	// the request and commits after the round that asked sends nothing. Such transactions
	// were in progress at that round's snapshot: waitFor holds them, and the relay reads again
	// after a short wait, doubling up to maxRecheck, until none of them is still in progress.
	var waitFor []string
	asked, recheck := false, time.Duration(0)
	for {
		drained, err := r.drainHeld(ctx, conn, s)
		if err != nil {
			return err
		}
		n, snap, err := r.round(ctx, conn, s, ask && recheck == 0)
		if err != nil {
			return err
		}
		switch {
		case n > 0 || drained > 0:
			// More may be waiting, and the request (if any) was withdrawn: read again at once.
			ask, asked, recheck, waitFor = false, false, 0, nil
			continue
		case !r.listenable():
			// An empty round without LISTEN waits PollInterval.
		case !ask:
			// Caught up: one more round asks the Writers to notify and looks once more, for what
			// committed before they were asked.
			ask = true
			continue
		}
		wait := r.config.PollInterval
		if r.listenable() {
			if !asked { // the round that asked
				asked, waitFor, recheck = true, inProgress(snap), firstRecheck
			} else if recheck > 0 {
				waitFor, recheck = stillInProgress(waitFor, snap), min(2*recheck, r.maxRecheck())
			}
			if len(waitFor) == 0 {
				recheck = 0
			} else {
				wait = recheck
				r.rechecks.Add(1)
			}
		}
		// A round takes its snapshot when it starts, so a transaction that commits later is in
		// the next round: its notification is delivered after its commit and waits in wake
		// (buffered by pgx and then by the channel) until this loop takes it, and a LISTEN
		// re-established after a lost connection wakes the loop too.
		if due, ok := s.nextDue(); ok {
			wait = max(0, min(wait, time.Until(due))) // a held topic's next try
		}
		if r.idleHook != nil {
			r.idleHook()
		}
		poll.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-poll.C:
		}
	}
}

// firstRecheck is the first wait before reading again for transactions that were in progress
// when the relay asked for notifications: about one commit.
const firstRecheck = 2 * time.Millisecond

// maxRecheck caps the re-reads' backoff: PollInterval, or 1s if that is longer, so that a
// long transaction elsewhere on the server costs at most two statements a second.
func (r *Relay) maxRecheck() time.Duration { return min(r.config.PollInterval, time.Second) }

// inProgress returns the in-progress transaction ids of a pg_snapshot's text form
// ("xmin:xmax:xip,xip,...").
func inProgress(snap string) []string {
	i := strings.LastIndexByte(snap, ':')
	if i < 0 || i == len(snap)-1 {
		return nil
	}
	return strings.Split(snap[i+1:], ",")
}

// stillInProgress returns the ids of ids that are in progress in snap.
func stillInProgress(ids []string, snap string) []string {
	now := inProgress(snap)
	var out []string
	for _, id := range ids {
		if slices.Contains(now, id) {
			out = append(out, id)
		}
	}
	return out
}

// idleTTL is how long a relay's request for notifications lasts (outbox_offsets.idle_until):
// an idle relay renews it at least every PollInterval, and a relay that stopped or got busy
// stops costing the Writers notifications once it lapses.
func (r *Relay) idleTTL() time.Duration { return 2*r.config.PollInterval + time.Second }

// listenable reports whether a commit after a round's snapshot wakes the relay.
func (r *Relay) listenable() bool { return !r.config.DisableListen && !r.noListen.Load() }

// listen LISTENs on the schema's channel on a connection of its own until stop is called, and
// sends on wake (without blocking: one pending wake-up covers any number of commits) for
// every notification and every time LISTEN is (re)established.
func (r *Relay) listen(ctx context.Context) (wake <-chan struct{}, stop func()) {
	ch := make(chan struct{}, 1)
	signal := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	if !r.listenable() {
		return ch, func() {}
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer r.listening.Store(false)
		err := pgnotify.Listener{
			DB:       r.db,
			Channels: map[string]func(string){r.channel: func(string) { signal() }},
			OnListen: func() {
				r.listening.Store(true)
				signal() // rows may have committed while nobody listened
			},
			OnLost: func(err error, backoff time.Duration) {
				r.listening.Store(false)
				r.failures.Add(1)
				r.logger.Error("Relay LISTEN connection lost; polling every PollInterval until it is back", err,
					watermill.LogFields{"backoff": backoff, "poll_interval": r.config.PollInterval})
			},
		}.Run(lctx)
		if errors.Is(err, pgnotify.ErrNotPgx) {
			r.noListen.Store(true)
			r.logger.Info("LISTEN/NOTIFY unavailable, the relay polls every PollInterval", watermill.LogFields{"reason": err.Error(), "poll_interval": r.config.PollInterval})
		}
	}()
	return ch, func() { cancel(); <-done }
}

// RelayOnce tries each held topic once (publishing up to one batch of its held rows) and
// forwards at most one batch of the outbox, without taking leadership, and returns how many
// rows it published, held, rejected or passed over. It is meant for tests, the CLI and callers
// with their own scheduling; running it beside an active Run of the same Name can publish rows
// twice (never lose them).
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: relay connection: %w", err)
	}
	defer conn.Close()
	if err := r.register(ctx, conn); err != nil {
		return 0, err
	}
	s, err := r.newSession(ctx, conn)
	if err != nil {
		return 0, err
	}
	drained, err := r.drainHeld(ctx, conn, s)
	if err != nil {
		return drained, err
	}
	n, _, err := r.round(ctx, conn, s, false)
	return drained + n, err
}

// round publishes one batch; with idle, its position read asks Writers to notify the relay. A round is the set of transactions that committed between the
// relay's previous snapshot and a new one, published in "offset" (insertion) order; a round
// larger than BatchSize is published over several calls. The position advances after each run
// of one topic that published, so a crash republishes at most one batch.
func (r *Relay) round(ctx context.Context, conn *sql.Conn, s *session, idle bool) (int, string, error) {
	var pos position
	query, args := r.qPosition, []any{r.config.Name}
	if idle && r.listenable() {
		query, args = r.qPositionIdle, append(args, r.idleTTL().Microseconds())
	}
	if err := conn.QueryRowContext(ctx, query, args...).Scan(&pos.prev, &pos.target, &pos.last); err != nil {
		return 0, "", fmt.Errorf("outbox: read relay position: %w", err)
	}
	snap, rows, err := r.read(ctx, conn, pos)
	if err != nil {
		return 0, "", err
	}
	r.rounds.Add(1)
	more := len(rows) > r.config.BatchSize // the query reads one row beyond the batch to know
	if more {
		rows = rows[:r.config.BatchSize]
	}
	if len(rows) == 0 {
		if pos.target.Valid { // the previous batch ended the round exactly
			return 0, snap, r.advance(ctx, conn, pos, position{prev: pos.target.String}, false)
		}
		// Nothing committed since prev: keep it. Writing the new snapshot would cost a commit
		// per idle poll and change nothing that is published.
		return 0, snap, nil
	}
	published := 0
	for start := 0; start < len(rows); {
		run, end, err := r.decodeRun(ctx, conn, s, rows, start)
		if err != nil {
			return published, snap, err
		}
		if len(run.msgs) > 0 {
			n, err := r.forward(ctx, conn, s, run)
			published += n
			if err != nil {
				return published, snap, err
			}
		}
		next := position{
			prev:   pos.prev,
			target: sql.NullString{String: snap, Valid: true},
			last:   sql.NullInt64{Int64: rows[end-1].offset, Valid: true},
		}
		if end == len(rows) && !more {
			next = position{prev: snap} // the round is complete
		}
		// What the broker accepted is recorded even if ctx ends meanwhile (Close), so that a
		// clean stop does not publish it again; the wait for that one UPDATE is bounded.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
		err = r.advance(actx, conn, pos, next, published > 0)
		cancel()
		if err != nil {
			return published, snap, err
		}
		pos = next
		start = end
	}
	r.lastRelay.Store(time.Now().UnixNano())
	if err := r.checkSources(ctx, conn, s); err != nil {
		return len(rows), snap, err
	}
	return len(rows), snap, nil
}

// publishLanes publishes a run of one topic: in one call, or over PublishLanes concurrent
// calls keyed by LaneKey, each lane in the batch's order. It returns once every lane published.
func (r *Relay) publishLanes(ctx context.Context, topic string, msgs []*message.Message) error {
	lanes := min(r.config.PublishLanes, len(msgs))
	if lanes <= 1 {
		return r.publish(ctx, topic, msgs)
	}
	byLane := make([][]*message.Message, lanes)
	h := fnv.New32a()
	for _, m := range msgs {
		h.Reset()
		_, _ = h.Write([]byte(r.config.LaneKey(topic, m)))
		i := h.Sum32() % uint32(lanes)
		byLane[i] = append(byLane[i], m)
	}
	errs := make(chan error, lanes)
	for _, lane := range byLane {
		if len(lane) == 0 {
			errs <- nil
			continue
		}
		go func() { errs <- r.publish(ctx, topic, lane) }()
	}
	var first error
	for range lanes {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// read returns the snapshot of the round and up to BatchSize+1 of its rows from pos: a new
// round (and its snapshot) when pos has no target, else the rest of the round in progress.
func (r *Relay) read(ctx context.Context, conn *sql.Conn, pos position) (string, []outboxRow, error) {
	var rs *sql.Rows
	var err error
	snap := pos.target.String
	if pos.target.Valid {
		rs, err = conn.QueryContext(ctx, r.qReadRest, pos.prev, pos.target.String, pos.last.Int64, r.config.BatchSize+1, r.config.Source)
	} else {
		rs, err = conn.QueryContext(ctx, r.qReadRound, pos.prev, r.config.BatchSize+1, r.config.Source)
	}
	if err != nil {
		return "", nil, fmt.Errorf("outbox: read outbox: %w", err)
	}
	defer rs.Close()
	out := make([]outboxRow, 0, r.config.BatchSize+1)
	for rs.Next() {
		var row outboxRow
		var offset sql.NullInt64
		var txID, uuid, source, payload sql.NullString
		dest := []any{&offset, &txID, &uuid, &source, &payload, &row.metadata}
		if !pos.target.Valid {
			dest = append([]any{&snap}, dest...)
		}
		if err := rs.Scan(dest...); err != nil {
			return "", nil, fmt.Errorf("outbox: scan outbox row: %w", err)
		}
		if !offset.Valid { // qReadRound's row for an empty round: the snapshot alone
			continue
		}
		row.offset, row.txID, row.uuid, row.payload = offset.Int64, txID.String, uuid.String, payload.String
		row.source, row.mine = source.String, source.String == r.config.Source
		out = append(out, row)
	}
	if err := rs.Err(); err != nil {
		return "", nil, fmt.Errorf("outbox: read outbox: %w", err)
	}
	return snap, out, nil
}

// run is a run of rows of the relay's Source for one topic, with their decoded messages
// (rows[i] holds msgs[i]).
type run struct {
	topic string
	rows  []outboxRow
	msgs  []*message.Message
}

// decodeRun decodes rows from start while they share a destination topic, passing over rows
// of other sources. Rows that cannot be decoded are set aside in outbox_rejected; the run ends
// before the first row of another topic.
func (r *Relay) decodeRun(ctx context.Context, conn *sql.Conn, s *session, rows []outboxRow, start int) (run, int, error) {
	var out run
	i := start
	for ; i < len(rows); i++ {
		if !rows[i].mine {
			r.otherSource.Add(1)
			s.sawSource(rows[i].source)
			continue
		}
		t, msg, err := unmarshalEnvelope([]byte(rows[i].payload))
		if err != nil {
			if len(out.msgs) > 0 {
				break // publish what we have first, so the rejection is recorded in order
			}
			if err := r.reject(ctx, conn, rows[i], "", err); err != nil {
				return run{}, 0, err
			}
			return run{}, i + 1, nil
		}
		if len(out.msgs) > 0 && t != out.topic {
			break
		}
		out.topic = t
		out.rows = append(out.rows, rows[i])
		out.msgs = append(out.msgs, msg)
	}
	return out, i, nil
}

// reject copies row into outbox_rejected with the reason: it could not be decoded (topic ""),
// or the publisher refused it for good.
func (r *Relay) reject(ctx context.Context, conn *sql.Conn, row outboxRow, topic string, cause error) error {
	var payload, metadata, dest any
	if row.payload != "" {
		payload = row.payload
	}
	if row.metadata.Valid {
		metadata = row.metadata.String
	}
	if topic != "" {
		dest = topic
	}
	if _, err := conn.ExecContext(ctx, r.qReject, r.config.Name, row.offset, row.txID, row.uuid, payload, metadata, cause.Error(), dest, row.source); err != nil {
		return fmt.Errorf("outbox: record rejected row %s: %w", row.uuid, err)
	}
	r.rejected.Add(1)
	if topic == "" {
		r.logger.Error("Outbox row rejected: it cannot be decoded; set aside in outbox_rejected", cause, watermill.LogFields{"uuid": row.uuid, "offset": row.offset})
	} else {
		r.logger.Error("Outbox row rejected: the broker refuses it for good; set aside in outbox_rejected, the rows behind it go on", cause,
			watermill.LogFields{"uuid": row.uuid, "offset": row.offset, "topic": topic})
	}
	return nil
}

// publish makes one attempt at publishing msgs: retries are the caller's (hold.go), so that a
// failing topic holds back its own rows only.
func (r *Relay) publish(ctx context.Context, topic string, msgs []*message.Message) (err error) {
	spans := tracing.StartRelay(ctx, r.tracer, r.config.Name, topic, msgs)
	defer func() { tracing.EndAll(spans, err) }()
	return r.publisher.Publish(topic, msgs...)
}

func (r *Relay) advance(ctx context.Context, conn *sql.Conn, from, to position, published bool) error {
	res, err := conn.ExecContext(ctx, r.qAdvance, r.config.Name, to.prev, to.target, to.last, from.prev, from.target, from.last, published)
	if err != nil {
		return fmt.Errorf("outbox: record relay position: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		r.fenced.Add(1)
		return errors.New("outbox: relay position was moved by another relay instance; re-reading it")
	}
	return nil
}

// Name is the relay's position name (RelayConfig.Name), the label its metrics carry.
func (r *Relay) Name() string { return r.config.Name }
