package operate

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/inboxops"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// The read functions below back both the HTTP API and `wmonce status`. They only SELECT.

// SchemaStatus says which migrations a schema has.
type SchemaStatus struct {
	Schema  string `json:"schema"`
	Version int    `json:"version"`
	// Latest is the newest migration this binary carries.
	Latest int `json:"latest"`
	// Unrecorded is true when the schema has watermill-once's tables but records no migration
	// (built from an earlier release's printed SQL): Hint then says how to record it.
	Unrecorded bool `json:"unrecorded,omitempty"`
	// Missing lists versions below Version that the version table has no row for (deleted by
	// hand); Migrate refuses such a schema until they are recorded.
	Missing []int `json:"missing,omitempty"`
	// Hint is set when the schema is behind (or ahead of) this binary, or its version table is
	// incomplete, and says what to run.
	Hint string `json:"hint,omitempty"`
}

// ReadSchemaStatus returns the applied and latest migration versions of schema.
func ReadSchemaStatus(ctx context.Context, db *sql.DB, schema string) (SchemaStatus, error) {
	m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
	if err != nil {
		return SchemaStatus{}, err
	}
	st, err := m.State(ctx)
	if err != nil {
		return SchemaStatus{}, err
	}
	s := SchemaStatus{Schema: schema, Version: st.Version, Latest: migrate.Latest(), Unrecorded: st.Unrecorded, Missing: st.Missing}
	s.Hint = schemaHint(s)
	return s, nil
}

// schemaHint says what to run when the schema is behind or ahead of this binary, or its
// version table is incomplete; "" when it is up to date.
func schemaHint(s SchemaStatus) string {
	schema, v := s.Schema, s.Version
	switch {
	case s.Unrecorded:
		return fmt.Sprintf("schema %s has watermill-once tables but records no migration (version 0); %s", schema, migrate.BaselineAdvice(schema))
	case v == 0:
		return fmt.Sprintf("schema %s is at version 0 (no watermill-once tables): run `wmonce -schema %s migrate up`", schema, schema)
	case len(s.Missing) > 0:
		// Migrate refuses this schema until the rows are back; the tools still read it.
		return fmt.Sprintf("schema %s is at version %d but %s", schema, v, migrate.MissingAdvice(schema, s.Missing))
	case v < s.Latest:
		return fmt.Sprintf("schema %s is at version %d, this binary knows %d: run `wmonce -schema %s migrate up`", schema, v, s.Latest, schema)
	case v > s.Latest:
		return fmt.Sprintf("schema %s is at version %d, newer than this binary (%d): upgrade wmonce", schema, v, s.Latest)
	}
	return ""
}

// ConsumerStats is one consumer of the effectively-once middleware: its claims in the
// database and, when the middleware runs in this process, its in-process counts.
type ConsumerStats struct {
	Consumer string `json:"consumer"`
	// Claims counts the consumer's rows in processed_messages and processed_messages_daily:
	// messages applied and not yet deleted by retention.
	Claims int64 `json:"claims"`
	// NewestClaim is when the most recent of them was applied (nil, null in JSON, when there
	// are none).
	NewestClaim *time.Time `json:"newest_claim"`
	// Counters are the totals since the middlewares given to Config were created, summed over
	// them; nil when none of them has seen this consumer (or none was given).
	Counters *Counters `json:"counters,omitempty"`
	// DuplicateRate is Duplicates / (Fresh + Duplicates) from Counters; nil without traffic.
	DuplicateRate *float64 `json:"duplicate_rate,omitempty"`
}

// ReadConsumers lists every consumer with claims in schema, with its claim count and newest
// claim (once.Stats), merged with the in-process counts of mws (consumers seen only there are listed too),
// ordered by name. The counts scan the claim tables: on tables of many millions of rows this
// takes seconds, so callers bound it with a context deadline. A schema without
// processed_messages is an error for which pgtx.IsUndefinedTable is true, not an empty list.
func ReadConsumers(ctx context.Context, db *sql.DB, schema string, mws []*once.Middleware) ([]ConsumerStats, error) {
	if db == nil {
		return nil, errors.New("admin: db is nil")
	}
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return nil, err
	}
	// A schema without processed_messages is not migrated: the error is undefined_table (503
	// in the API, a "migrate up" hint in the CLI), not an answer with no consumers.
	stats, err := once.Stats(ctx, db, schema)
	if err != nil {
		return nil, fmt.Errorf("read consumers: %w", err)
	}
	byName := map[string]*ConsumerStats{}
	for consumer, st := range stats {
		byName[consumer] = &ConsumerStats{Consumer: consumer, Claims: st.Claims, NewestClaim: TimePtr(st.NewestClaim)}
	}
	for consumer, counts := range sumCounts(mws) {
		c := entry(byName, consumer, func() *ConsumerStats { return &ConsumerStats{Consumer: consumer} })
		c.Counters = &Counters{
			Fresh: counts.Fresh, Duplicates: counts.Duplicates, FingerprintMismatches: counts.FingerprintMismatches,
			Failed: counts.Failed, TxRetries: counts.TxRetries, Refused: counts.Refused, TooOld: counts.TooOld,
			HandlerEndedTx: counts.HandlerEndedTx, HandlerAcked: counts.HandlerAcked,
			DelayedRetries: counts.DelayedRetries, DelayedRetriesNacked: counts.DelayedRetriesNacked,
		}
		c.DuplicateRate = duplicateRate(counts.Fresh, counts.Duplicates)
	}
	return sortedByName(byName), nil
}

// duplicateRate is duplicates / (fresh + duplicates); nil without traffic.
func duplicateRate(fresh, duplicates uint64) *float64 {
	if fresh+duplicates == 0 {
		return nil
	}
	rate := float64(duplicates) / float64(fresh+duplicates)
	return &rate
}

// entry returns m's entry for name, adding made() first when there is none.
func entry[T any](m map[string]*T, name string, made func() *T) *T {
	e := m[name]
	if e == nil {
		e = made()
		m[name] = e
	}
	return e
}

// sortedByName returns the entries of m ordered by their name (the key).
func sortedByName[T any](m map[string]*T) []T {
	out := make([]T, 0, len(m))
	for _, name := range slices.Sorted(maps.Keys(m)) {
		out = append(out, *m[name])
	}
	return out
}

// Counters are once.Counters as JSON.
type Counters struct {
	Fresh                 uint64 `json:"fresh"`
	Duplicates            uint64 `json:"duplicates"`
	FingerprintMismatches uint64 `json:"fingerprint_mismatches"`
	Failed                uint64 `json:"failed"`
	TxRetries             uint64 `json:"tx_retries"`
	Refused               uint64 `json:"refused"`
	TooOld                uint64 `json:"too_old"`
	HandlerEndedTx        uint64 `json:"handler_ended_tx"`
	HandlerAcked          uint64 `json:"handler_acked"`
	DelayedRetries        uint64 `json:"delayed_retries"`
	DelayedRetriesNacked  uint64 `json:"delayed_retries_nacked"`
}

func sumCounts(mws []*once.Middleware) map[string]once.Counters {
	out := map[string]once.Counters{}
	for _, mw := range mws {
		if mw == nil {
			continue
		}
		for consumer, c := range mw.Counters().Consumers() {
			s := out[consumer]
			s.Fresh += c.Fresh
			s.Duplicates += c.Duplicates
			s.FingerprintMismatches += c.FingerprintMismatches
			s.Failed += c.Failed
			s.TxRetries += c.TxRetries
			s.Refused += c.Refused
			s.TooOld += c.TooOld
			s.HandlerEndedTx += c.HandlerEndedTx
			s.HandlerAcked += c.HandlerAcked
			s.DelayedRetries += c.DelayedRetries
			s.DelayedRetriesNacked += c.DelayedRetriesNacked
			out[consumer] = s
		}
	}
	return out
}

// InboxStats is one inbox consumer's rows by status.
type InboxStats struct {
	Consumer   string `json:"consumer"`
	Pending    int64  `json:"pending"`
	Retrying   int64  `json:"retrying"` // the part of Pending that failed before
	InProgress int64  `json:"in_progress"`
	Failed     int64  `json:"failed"`
	Done       int64  `json:"done"`
	Skipped    int64  `json:"skipped"`
	// OldestPendingReceivedAt and OldestPendingAgeSeconds describe the oldest PENDING row
	// (nil, null in JSON, and 0 when there is none): alert when the age grows.
	OldestPendingReceivedAt *time.Time `json:"oldest_pending_received_at"`
	OldestPendingAgeSeconds float64    `json:"oldest_pending_age_seconds"`
	// PausedAt is when the consumer was paused (inbox.Ops.Pause); nil (null) while it runs.
	PausedAt *time.Time `json:"paused_at"`
}

// ReadInbox counts every inbox consumer's rows by status, ordered by consumer. Unfinished
// rows and the oldest pending age come from inbox.Ops.AllStats; DONE and SKIPPED rows from
// inboxops.CountFinished, which scans the table.
func ReadInbox(ctx context.Context, db *sql.DB, schema string) ([]InboxStats, error) {
	ops, err := inbox.NewOps(db, inbox.OpsConfig{Schema: schema}, nil)
	if err != nil {
		return nil, err
	}
	byName := map[string]*InboxStats{}
	get := func(consumer string) *InboxStats {
		return entry(byName, consumer, func() *InboxStats { return &InboxStats{Consumer: consumer} })
	}
	finished, err := inboxops.CountFinished(ctx, ops)
	if err != nil {
		return nil, fmt.Errorf("read inbox: %w", err)
	}
	for consumer, st := range finished {
		s := get(consumer)
		s.Done, s.Skipped = st.Done, st.Skipped
	}
	stats, err := ops.AllStats(ctx)
	if err != nil {
		return nil, err
	}
	for consumer, st := range stats {
		s := get(consumer)
		s.Pending, s.Retrying, s.InProgress, s.Failed = st.Pending, st.Retrying, st.InProgress, st.Failed
		s.OldestPendingReceivedAt = TimePtr(st.OldestPendingReceivedAt)
		s.OldestPendingAgeSeconds = st.OldestPendingAge.Seconds()
		s.PausedAt = TimePtr(st.PausedAt)
	}
	return sortedByName(byName), nil
}

// RelayStats is one outbox relay's position, as JSON. OldestPending is when the oldest row
// it has not forwarded was written: nil (null in JSON) when Backlog is 0.
type RelayStats struct {
	Name          string     `json:"name"`
	Backlog       int64      `json:"backlog"`
	OldestPending *time.Time `json:"oldest_pending"`
	LagSeconds    float64    `json:"lag_seconds"`

	// Source is the source whose rows the relay forwards (outbox.RelayConfig.Source).
	Source string `json:"source"`
	// Held lists the topics the relay holds because publishing to them failed (their rows,
	// counted in Backlog, wait in outbox_held while the other topics go on).
	Held []HeldTopic `json:"held"`
	// Delayed counts rows waiting in outbox_delayed for their time (not in Backlog); NextDue is
	// when the earliest is due (nil, null, when none).
	Delayed int64      `json:"delayed"`
	NextDue *time.Time `json:"next_due"`
	// PausedAt is when the relay was paused (outbox.PauseRelay); nil (null) while it runs.
	PausedAt *time.Time `json:"paused_at"`
	// Moved: the relay's position was recorded on another cluster (a restore or a move,
	// outbox.RelayStats.Moved); it forwards nothing, and Finding says why and what to run.
	Moved   bool   `json:"moved"`
	Finding string `json:"finding,omitempty"`
}

// HeldTopic is a topic a relay holds (outbox.HeldTopic).
type HeldTopic struct {
	Topic string    `json:"topic"`
	Rows  int64     `json:"rows"`
	Since time.Time `json:"since"`
}

// OutboxStats is every relay's backlog and lag and the number of rejected outbox rows.
type OutboxStats struct {
	Relays   []RelayStats `json:"relays"`
	Rejected int64        `json:"rejected"`
}

// ReadOutbox wraps outbox.Stats.
func ReadOutbox(ctx context.Context, db *sql.DB, schema string) (OutboxStats, error) {
	relays, rejected, err := outbox.Stats(ctx, db, schema)
	if err != nil {
		return OutboxStats{}, err
	}
	out := OutboxStats{Relays: make([]RelayStats, 0, len(relays)), Rejected: rejected}
	for _, r := range relays {
		out.Relays = append(out.Relays, RelayStats{Name: r.Name, Backlog: r.Backlog, OldestPending: TimePtr(r.OldestPending), LagSeconds: r.Lag.Seconds()})

		last := &out.Relays[len(out.Relays)-1]
		last.Source, last.Held = r.Source, make([]HeldTopic, len(r.Held))
		last.Delayed, last.NextDue, last.PausedAt = r.Delayed, TimePtr(r.NextDue), TimePtr(r.PausedAt)
		last.Moved, last.Finding = r.Moved != "", r.Moved
		for i, h := range r.Held {
			last.Held[i] = HeldTopic{Topic: h.Topic, Rows: h.Rows, Since: h.Since}
		}
	}
	return out, nil
}

// InboxRow is an inbox row as the API shows it. List leaves the payload out (PayloadSize
// tells its length); Inspect includes it, as text when it is valid UTF-8 and in base64
// otherwise. LeaseUntil and FinishedAt are nil (null in JSON) when the row has none.
type InboxRow struct {
	ID            int64             `json:"id"`
	Consumer      string            `json:"consumer"`
	MessageID     string            `json:"message_id"`
	MessageUUID   string            `json:"message_uuid"`
	OrderingKey   string            `json:"ordering_key,omitempty"`
	Topic         string            `json:"topic,omitempty"`
	PayloadSize   int               `json:"payload_size"`
	Payload       *string           `json:"payload,omitempty"`
	PayloadBase64 *string           `json:"payload_base64,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	Status        string            `json:"status"`
	Attempts      int               `json:"attempts"`
	NextAttemptAt time.Time         `json:"next_attempt_at"`
	LeaseUntil    *time.Time        `json:"lease_until"`
	LastError     string            `json:"last_error,omitempty"`
	ReceivedAt    time.Time         `json:"received_at"`
	FinishedAt    *time.Time        `json:"finished_at"`
}

// NewInboxRow converts r; withPayload includes the payload and metadata.
func NewInboxRow(r inbox.Row, withPayload bool) InboxRow {
	out := InboxRow{
		ID: r.ID, Consumer: r.Consumer, MessageID: r.MessageID, MessageUUID: r.MessageUUID,
		OrderingKey: r.OrderingKey, Topic: r.Topic, PayloadSize: len(r.Payload),
		Status: string(r.Status), Attempts: r.Attempts, NextAttemptAt: r.NextAttemptAt,
		LastError: r.LastError, ReceivedAt: r.ReceivedAt,
		LeaseUntil: TimePtr(r.LeaseUntil), FinishedAt: TimePtr(r.FinishedAt),
	}
	if withPayload {
		out.Metadata = r.Metadata
		if utf8.Valid(r.Payload) {
			s := string(r.Payload)
			out.Payload = &s
		} else {
			s := base64.StdEncoding.EncodeToString(r.Payload)
			out.PayloadBase64 = &s
		}
	}
	return out
}

// TimePtr is the one rule for a time that may be unset: a zero time becomes nil, which JSON
// shows as null (never "0001-01-01T00:00:00Z"), and the field stays present.
func TimePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Processed answers "was message Key processed by Consumer, and when?".
type Processed struct {
	Consumer string `json:"consumer"`
	Key      string `json:"key"`
	// Processed is true when a dedupe claim exists or the consumer's inbox row is DONE.
	Processed bool `json:"processed"`
	// Claim is the middleware's dedupe record, if any.
	Claim *ClaimRecord `json:"claim,omitempty"`
	// Inbox is the consumer's inbox row for the key, if any (without payload).
	Inbox *InboxRow `json:"inbox,omitempty"`
}

// ClaimRecord is a once.Claim as JSON. OccurredOn is the claim's day partition: nil (null in
// JSON) for a claim in processed_messages.
type ClaimRecord struct {
	ProcessedAt   time.Time  `json:"processed_at"`
	PayloadSHA256 string     `json:"payload_sha256"`
	OccurredOn    *time.Time `json:"occurred_on"`
}

// LookupProcessed looks key up in the middleware's claims (once.LookupClaim) and in the
// inbox of consumer. Neither found means the message was never applied, or its records were
// deleted by retention.
func LookupProcessed(ctx context.Context, db *sql.DB, schema, consumer, key string) (Processed, error) {
	p := Processed{Consumer: consumer, Key: key}
	claim, found, err := once.LookupClaim(ctx, db, schema, consumer, key)
	if err != nil {
		return p, err
	}
	if found {
		p.Processed = true
		p.Claim = &ClaimRecord{ProcessedAt: claim.ProcessedAt, PayloadSHA256: hex.EncodeToString(claim.PayloadSHA256), OccurredOn: TimePtr(claim.OccurredOn)}
	}
	if p.Inbox, err = inboxRecord(ctx, db, schema, consumer, key); err != nil {
		return p, err
	}
	p.Processed = p.Processed || p.Inbox != nil && p.Inbox.Status == string(inbox.StatusDone)
	return p, nil
}

// inboxRecord is consumer's inbox row for key, without payload; nil when there is none.
func inboxRecord(ctx context.Context, db *sql.DB, schema, consumer, key string) (*InboxRow, error) {
	ops, err := inbox.NewOps(db, inbox.OpsConfig{Schema: schema}, nil)
	if err != nil {
		return nil, err
	}
	row, err := ops.InspectMessage(ctx, consumer, key)
	if errors.Is(err, inbox.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := NewInboxRow(row, false)
	return &r, nil
}
