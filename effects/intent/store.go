package intent

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/effects/idemkey"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// Status is the state of an intent.
type Status string

const (
	StatusPending Status = "PENDING" // recorded, waiting for a sender
	StatusSending Status = "SENDING" // claimed by a sender; the provider call may be under way
	StatusSent    Status = "SENT"    // the provider confirmed it (ProviderID set)
	StatusFailed  Status = "FAILED"  // rejected, or attempts exhausted: needs attention
	StatusSkipped Status = "SKIPPED" // a crash in SENDING on a Skip channel: needs attention
)

// Intent is one recorded effect.
type Intent struct {
	ID                      int64
	Channel                 string
	Key                     string // the intent key: unique per channel, the idempotency key sent to the provider
	Consumer, EventID, Step string
	Payload                 []byte
	Status                  Status
	Attempts                int // how often a sender took it (sends, and reconciliations after a crash)

	ProviderID, LastError string
	CreatedAt, UpdatedAt  time.Time
	SentAt                time.Time // zero unless SENT
	// TraceParent and TraceState: the W3C trace context of the span that recorded the intent.
	TraceParent, TraceState string
}

// StoreConfig configures a Store.
type StoreConfig struct {
	// Schema holds the intents table. Default pgtx.DefaultSchema.
	Schema string
	// Source says how Record finds a message's consumer and event id: configure it like the
	// middleware; the zero value matches its defaults (handler name, message UUID).
	Source idemkey.Source
}

func (c *StoreConfig) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
}

// Validate reports a configuration that cannot work.
func (c StoreConfig) Validate() error {
	return pgtx.ValidateIdentifier("schema", c.Schema)
}

// Store records intents and reads and requeues them.
type Store struct {
	db     *sql.DB
	config StoreConfig
	table  string

	qInsert, qGet, qRequeue, qStats, qBacklog string
}

// NewStore returns a Store. db serves reads and Requeue; recording uses the caller's transaction.
func NewStore(db *sql.DB, config StoreConfig) (*Store, error) {
	if db == nil {
		return nil, errors.New("intent: db is nil: open one with pgtx.Open")
	}
	if err := setup.Config(&config, (*StoreConfig).setDefaults, "intent: invalid store config"); err != nil {
		return nil, err
	}
	table := pgtx.QualifiedName(config.Schema, "intents")
	return &Store{
		db:     db,
		config: config,
		table:  table,
		qInsert: `INSERT INTO ` + table + ` (channel, intent_key, consumer, event_id, step, payload, trace_parent, trace_state)
VALUES ($1, $2, $3, $4, $5, $6, nullif($7, ''), nullif($8, '')) ON CONFLICT (channel, intent_key) DO NOTHING`,
		qGet: `SELECT ` + intentColumns + ` FROM ` + table + ` WHERE channel = $1 AND intent_key = $2`,
		qRequeue: `UPDATE ` + table + ` SET status = 'PENDING', run_after = now(), attempts = 0, claim_token = NULL,
    lease_until = NULL, updated_at = now()
WHERE channel = $1 AND intent_key = $2 AND status IN ('FAILED', 'SKIPPED')`,
		qStats: `SELECT channel, status, count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)
FROM ` + table + ` GROUP BY channel, status`,
		// One arm per partial index (intents_pending_idx, _sending_idx, _parked_idx), each
		// WHERE implying its index's predicate, so that SENT rows are never read.
		qBacklog: backlogArm(table, `status = 'PENDING'`) + `
UNION ALL ` + backlogArm(table, `status = 'SENDING'`) + `
UNION ALL ` + backlogArm(table, `status IN ('FAILED', 'SKIPPED')`),
	}, nil
}

func backlogArm(table, where string) string {
	return `SELECT channel, status, count(*), count(*) FILTER (WHERE attempts > 0),
    coalesce(extract(epoch FROM now() - min(created_at)), 0)
FROM ` + table + ` WHERE ` + where + ` GROUP BY channel, status`
}

const intentColumns = `id, channel, intent_key, consumer, event_id, step, payload, status, attempts,
    coalesce(provider_id, ''), coalesce(last_error, ''), created_at, updated_at, sent_at,
    coalesce(trace_parent, ''), coalesce(trace_state, '')`

// Draft describes an intent to record.
type Draft struct {
	// Channel names the provider the Sender uses ("sms"); required, at most 255 bytes.
	Channel string
	// Consumer and EventID identify the causing event; Record fills them from the message when
	// empty, RecordTx requires them.
	Consumer, EventID string
	// Step tells apart several effects of one event on one channel. Default: Channel.
	Step string
	// Payload is what the provider needs, handed over as is: keep it self-contained.
	Payload []byte
}

// Recorded reports the outcome of recording.
type Recorded struct {
	Key     string // the intent key, also the idempotency key the provider sees
	Created bool   // false when an earlier copy recorded it
}

// Record records d in the transaction of msg's context, filling Consumer and EventID from the
// message: the intent commits or rolls back with the handler.
func (s *Store) Record(msg *message.Message, d Draft) (Recorded, error) {
	if msg == nil {
		return Recorded{}, errors.New("intent: message is nil")
	}
	tx, ok := pgtx.TxFromContext(msg.Context())
	if !ok {
		return Recorded{}, fmt.Errorf("intent: %w: record intents inside a handler wrapped in the effectively-once middleware, or use RecordTx", pgtx.ErrNoTransaction)
	}
	if d.Consumer == "" || d.EventID == "" {
		consumer, id, err := s.config.Source.Parts(msg)
		if err != nil {
			return Recorded{}, fmt.Errorf("intent: %w", err)
		}
		d.Consumer, d.EventID = cmp.Or(d.Consumer, consumer), cmp.Or(d.EventID, id)
	}
	return s.RecordTx(msg.Context(), tx, d)
}

// RecordTx records d in tx; recording the same (channel, consumer, event id, step) again
// reports Created=false. In a transaction user code ended it fails with a permanent error
// wrapping wmonce.ErrHandlerEndedTx.
func (s *Store) RecordTx(ctx context.Context, tx pgtx.Executor, d Draft) (Recorded, error) {
	if setup.IsNil(tx) { // also a nil *sql.Tx from pgtx.TxFromContext outside a transaction
		return Recorded{}, fmt.Errorf("intent: %w: tx is nil (outside a transaction, pgtx.TxFromContext returns a nil *sql.Tx)", pgtx.ErrNoTransaction)
	}
	if err := validateChannel(d.Channel); err != nil {
		return Recorded{}, fmt.Errorf("intent: %w", err)
	}
	d.Step = cmp.Or(d.Step, d.Channel)
	key, err := idemkey.Derive(d.Consumer, d.EventID, d.Step)
	if err != nil {
		return Recorded{}, fmt.Errorf("intent: %w", err)
	}
	payload := d.Payload
	if payload == nil {
		payload = []byte{}
	}
	traceParent, traceState := tracing.TraceContext(ctx)
	res, err := tx.ExecContext(ctx, s.qInsert, d.Channel, key, d.Consumer, d.EventID, d.Step, payload, traceParent, traceState)
	if err != nil {
		if pgtx.IsUndefinedTable(err) {
			return Recorded{}, fmt.Errorf("intent: table %s is missing: run the migrations: %w", s.table, err)
		}
		if txguard.IsEnded(ctx, err) {
			// The handler committed or rolled back its transaction before recording: the
			// intent cannot join it. Permanent: running the handler again would do the same.
			err = txguard.Ended(err)
		}
		return Recorded{}, fmt.Errorf("intent: record %s/%s: %w", d.Channel, key, err)
	}
	n, _ := res.RowsAffected()
	return Recorded{Key: key, Created: n == 1}, nil
}

// validateChannel applies setup.CheckName, the rule every component applies to names.
func validateChannel(ch string) error { return setup.CheckName("channel", ch) }

type scanner interface{ Scan(dest ...any) error }

func scanIntent(row scanner) (Intent, error) {
	var in Intent
	var status string
	var sentAt sql.NullTime
	err := row.Scan(&in.ID, &in.Channel, &in.Key, &in.Consumer, &in.EventID, &in.Step, &in.Payload, &status,
		&in.Attempts, &in.ProviderID, &in.LastError, &in.CreatedAt, &in.UpdatedAt, &sentAt, &in.TraceParent, &in.TraceState)
	in.Status = Status(status)
	if sentAt.Valid {
		in.SentAt = sentAt.Time
	}
	return in, err
}

// ErrNotFound is returned by Get for an intent that does not exist.
var ErrNotFound = errors.New("intent: not found")

// Get returns the intent with key on channel.
func (s *Store) Get(ctx context.Context, channel, key string) (Intent, error) {
	in, err := scanIntent(s.db.QueryRowContext(ctx, s.qGet, channel, key))
	if errors.Is(err, sql.ErrNoRows) {
		return Intent{}, fmt.Errorf("%w: %s/%s", ErrNotFound, channel, key)
	}
	if err != nil {
		return Intent{}, fmt.Errorf("intent: get %s/%s: %w", channel, key, err)
	}
	return in, nil
}

// Requeue moves a FAILED or SKIPPED intent back to PENDING (attempts reset) and reports
// whether it did: a requeued SKIPPED intent may send a duplicate.
func (s *Store) Requeue(ctx context.Context, channel, key string) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.qRequeue, channel, key)
	if err != nil {
		return false, fmt.Errorf("intent: requeue %s/%s: %w", channel, key, err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// ChannelStats is the number of intents of one channel in one status.
type ChannelStats struct {
	Channel   string
	Status    Status
	Count     int64
	OldestAge time.Duration // the age of the oldest such intent
}

// Stats returns the number of intents per channel and status, reading every row.
func (s *Store) Stats(ctx context.Context) ([]ChannelStats, error) {
	out, err := pgtx.QueryAll(ctx, s.db, scanChannelStats, s.qStats)
	if err != nil {
		return nil, fmt.Errorf("intent: stats: %w", err)
	}
	return out, nil
}

func scanChannelStats(s pgtx.Scanner) (ChannelStats, error) {
	var c ChannelStats
	var status string
	var age float64
	if err := s.Scan(&c.Channel, &status, &c.Count, &age); err != nil {
		return ChannelStats{}, err
	}
	c.Status = Status(status)
	c.OldestAge = time.Duration(age * float64(time.Second))
	return c, nil
}

// Backlog is the unfinished intents of one channel.
type Backlog struct {
	Pending, Sending, Failed, Skipped int64
	Retrying                          int64 // PENDING intents waiting out a backoff
	// OldestPendingAge and OldestSendingAge are the ages of the oldest PENDING and SENDING
	// intent (0: none); growing, they mean no sender keeps up, or an intent stays in doubt.
	OldestPendingAge, OldestSendingAge time.Duration
}

// Backlog returns the unfinished intents per channel, reading no SENT row (metrics use it).
func (s *Store) Backlog(ctx context.Context) (map[string]Backlog, error) {
	out := map[string]Backlog{}
	err := pgtx.QueryEach(ctx, s.db, func(row pgtx.Scanner) error {
		var channel, status string
		var n, retrying int64
		var age float64
		if err := row.Scan(&channel, &status, &n, &retrying, &age); err != nil {
			return err
		}
		b := out[channel]
		oldest := time.Duration(age * float64(time.Second))
		switch Status(status) {
		case StatusPending:
			b.Pending, b.Retrying, b.OldestPendingAge = n, retrying, oldest
		case StatusSending:
			b.Sending, b.OldestSendingAge = n, oldest
		case StatusFailed:
			b.Failed = n
		case StatusSkipped:
			b.Skipped = n
		}
		out[channel] = b
		return nil
	}, s.qBacklog)
	if err != nil {
		return nil, fmt.Errorf("intent: backlog: %w", err)
	}
	return out, nil
}
