package inbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// Row is one inbox row as stored.
type Row struct {
	ID            int64
	Consumer      string
	MessageID     string // dedupe key
	MessageUUID   string
	OrderingKey   string // "" when unordered
	Topic         string
	Payload       []byte
	Metadata      map[string]string
	Status        Status
	Attempts      int // attempts started
	NextAttemptAt time.Time
	LeaseUntil    time.Time // zero unless IN_PROGRESS
	LastError     string    // most recent failure, kept after a later success for the record
	ReceivedAt    time.Time
	FinishedAt    time.Time // DONE or SKIPPED time; zero otherwise
}

const rowColumns = `id, consumer, message_id, message_uuid, coalesce(ordering_key, ''), topic, payload, metadata::text,
status, attempts, next_attempt_at, lease_until, coalesce(last_error, ''), received_at, finished_at`

func scanRow(s pgtx.Scanner) (Row, error) {
	var r Row
	var md, status string
	var lease, finished sql.NullTime
	if err := s.Scan(&r.ID, &r.Consumer, &r.MessageID, &r.MessageUUID, &r.OrderingKey, &r.Topic, &r.Payload, &md,
		&status, &r.Attempts, &r.NextAttemptAt, &lease, &r.LastError, &r.ReceivedAt, &finished); err != nil {
		return Row{}, err
	}
	r.Status = Status(status)
	r.LeaseUntil, r.FinishedAt = lease.Time, finished.Time
	if err := json.Unmarshal([]byte(md), &r.Metadata); err != nil {
		return Row{}, fmt.Errorf("row %d: metadata: %w", r.ID, err)
	}
	return r, nil
}

// Inspect returns one row by id.
func (o *Ops) Inspect(ctx context.Context, id int64) (Row, error) {
	r, err := scanRow(o.db.QueryRowContext(ctx, `SELECT `+rowColumns+` FROM `+o.q.table+` WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Row{}, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	if err != nil {
		return Row{}, fmt.Errorf("inbox: inspect row %d: %w", id, err)
	}
	return r, nil
}

// InspectMessage returns the row of one consumer's message by its dedupe key.
func (o *Ops) InspectMessage(ctx context.Context, consumer, messageID string) (Row, error) {
	r, err := scanRow(o.db.QueryRowContext(ctx, `SELECT `+rowColumns+` FROM `+o.q.table+` WHERE consumer = $1 AND message_id = $2`, consumer, messageID))
	if errors.Is(err, sql.ErrNoRows) {
		return Row{}, fmt.Errorf("%w: consumer %q, message %q", ErrNotFound, consumer, messageID)
	}
	if err != nil {
		return Row{}, fmt.Errorf("inbox: inspect message %q: %w", messageID, err)
	}
	return r, nil
}

// List returns up to limit rows matching f (default: every status) in received order. Page
// with f.AfterID set to the last id returned.
func (o *Ops) List(ctx context.Context, f Filter, limit int) ([]Row, error) {
	if limit < 1 || limit > MaxBatchSize {
		return nil, fmt.Errorf("inbox: list: limit must be between 1 and %d, got %d", MaxBatchSize, limit)
	}
	where, args, err := f.where(nil)
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	args = append(args, limit)
	out, err := pgtx.QueryAll(ctx, o.db, scanRow, `SELECT `+rowColumns+` FROM `+o.q.table+` WHERE `+where+` ORDER BY id LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: list: %w", err)
	}
	return out, nil
}
