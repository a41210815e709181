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
	ID       int64
	Channel  string
	Key      string // the intent key: unique per channel, the idempotency key sent to the provider
	Consumer string
	EventID  string
	Step     string
	Payload  []byte
	Status   Status
	// Attempts counts how often a sender took the intent (sends, and reconciliations after a
	// crash).
	Attempts   int
	ProviderID string
	LastError  string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	SentAt     time.Time // zero unless SENT
	// TraceParent and TraceState are the W3C trace context of the span that recorded the
	// intent ("" when it was recorded without one, or before migration 009): the sender's span
	// is its child.
	TraceParent string
	TraceState  string
}

// StoreConfig configures a Store.
type StoreConfig struct {
	// Schema holds the intents table (see package migrate). Default pgtx.DefaultSchema.
	Schema string
	// Source says how Record finds the consumer and event id of a message. Configure it like the
	// effectively-once middleware (Consumer, Key); the zero value matches the middleware's
	// defaults (handler name, message UUID).
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

// NewStore returns a Store on the intents table of config.Schema. db is used by the reading
// and requeueing methods only; recording always happens in the caller's transaction.
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
	// Channel names the provider the Sender uses for it ("sms", "email"). Required: a name
	// (not blank, at most 255 bytes, text PostgreSQL can store).
	Channel string
	// Consumer and EventID identify the event that causes the effect. Record fills them from
	// the message when empty; RecordTx requires them.
	Consumer string
	EventID  string
	// Step tells apart several effects of one event on one channel ("sms-buyer",
	// "sms-seller"). Default: Channel.
	Step string
	// Payload is what the provider needs (recipient, text, amount); the Sender hands it over as
	// is. Keep it self-contained: the provider call happens later, outside the handler.
	Payload []byte
}

// Recorded reports the outcome of recording.
type Recorded struct {
	// Key is the intent key, also the idempotency key the provider will see.
	Key string
	// Created is false when the intent already existed (recorded by an earlier copy).
	Created bool
}

// Record records d in the transaction of msg's context (the one the effectively-once
// middleware opened), taking Consumer and EventID from the message when d leaves them empty.
// The intent commits or rolls back with the handler.
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
		if d.Consumer == "" {
			d.Consumer = consumer
		}
		if d.EventID == "" {
			d.EventID = id
		}
	}
	return s.RecordTx(msg.Context(), tx, d)
}

// RecordTx records d in tx. Recording the same (channel, consumer, event id, step) again is a
// no-op that reports Created=false. In a *sql.Tx that user code has already ended (Commit or
// Rollback on the handler's transaction) it fails with a permanent error wrapping
// wmonce.ErrHandlerEndedTx.
func (s *Store) RecordTx(ctx context.Context, tx pgtx.Executor, d Draft) (Recorded, error) {
	if setup.IsNil(tx) { // also a nil *sql.Tx from pgtx.TxFromContext outside a transaction
		return Recorded{}, fmt.Errorf("intent: %w: tx is nil (outside a transaction, pgtx.TxFromContext returns a nil *sql.Tx)", pgtx.ErrNoTransaction)
	}
	if err := validateChannel(d.Channel); err != nil {
		return Recorded{}, fmt.Errorf("intent: %w", err)
	}
	if d.Step == "" {
		d.Step = d.Channel
	}
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

// Requeue moves a FAILED or SKIPPED intent back to PENDING with its attempts reset, for an
// operator who decided it must be sent after all. It reports whether the intent was requeued
// (false when it is in another state or does not exist). A requeued SKIPPED intent may cause a
// duplicate unless the provider honours the key: that is the decision being made.
func (s *Store) Requeue(ctx context.Context, channel, key string) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.qRequeue, channel, key)
	if err != nil {
		return false, fmt.Errorf("intent: requeue %s/%s: %w", channel, key, err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// ChannelStats is the number of intents of one channel in one status, read from the database.
type ChannelStats struct {
	Channel string
	Status  Status
	Count   int64
	// OldestAge is the age of the oldest such intent: alert when it grows for PENDING (the
	// sender is not keeping up or not running) and when FAILED or SKIPPED rows exist at all.
	OldestAge time.Duration
}

// Stats returns the number of intents per channel and status. It reads every row, SENT ones
// included; Backlog reads only the unfinished ones.
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
	// Retrying counts the PENDING intents a sender took before (waiting out a backoff).
	Retrying int64
	// OldestPendingAge and OldestSendingAge are the ages, since they were recorded, of the
	// oldest PENDING and the oldest SENDING intent by the database clock; 0 when there is none.
	// A growing OldestPendingAge means no sender is keeping up (or running) for the channel; a
	// growing OldestSendingAge means an intent keeps coming back in doubt (unknown outcomes
	// on a Reconcile channel, lookups failing).
	OldestPendingAge, OldestSendingAge time.Duration
}

// Backlog returns the unfinished (PENDING, SENDING, FAILED, SKIPPED) intents of every channel
// that has some. Unlike Stats it reads no SENT row: each status is counted through its
// partial index, so the cost follows the backlog, not the table. It is what package metrics
// exports at scrape time.
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
