package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/pgtx"
)

// Delayed delivery (docs/outbox-relay.md, Delayed delivery and pausing): a message whose MetadataDelayedUntil is
// in the future when the relay reads it is set aside in outbox_delayed and published from
// there once due.

// Metadata keys of Watermill's components/delay: a message is due at MetadataDelayedUntil
// (RFC 3339); MetadataDelayedFor is informational only.
const (
	MetadataDelayedUntil = delay.DelayedUntilKey
	MetadataDelayedFor   = delay.DelayedForKey
)

// PublishTxAt is PublishTx for messages to be forwarded not before at: it sets
// MetadataDelayedUntil and MetadataDelayedFor on each message, replacing theirs, and stores
// them in tx. A time in the past (or zero) is delivery at once.
func (w *Writer) PublishTxAt(ctx context.Context, tx pgtx.Executor, at time.Time, topic string, msgs ...*message.Message) error {
	until, after := at.UTC().Format(time.RFC3339Nano), max(time.Until(at), 0).String()
	for _, msg := range msgs {
		if msg == nil {
			continue // refused by store, with the others
		}
		if msg.Metadata == nil {
			msg.Metadata = message.Metadata{}
		}
		msg.Metadata.Set(MetadataDelayedUntil, until)
		msg.Metadata.Set(MetadataDelayedFor, after)
	}
	return w.PublishTx(ctx, tx, topic, msgs...)
}

// delayedRow is a row the relay read before it was due.
type delayedRow struct {
	row   outboxRow
	topic string
	due   time.Time
}

// dueLater reports when msg is due, if that is after now: an unreadable MetadataDelayedUntil
// (a row not written by PublishTx, which refuses it) is logged and published at once.
func (r *Relay) dueLater(msg *message.Message, now time.Time) (time.Time, bool) {
	due, ok, err := outboxops.DueAt(msg.Metadata)
	if err != nil {
		r.logger.Error("Outbox row has unreadable delay metadata; publishing it now", err, map[string]any{"uuid": msg.UUID})
		return time.Time{}, false
	}
	return due, ok && due.After(now)
}

// setAside copies rows read before they were due into outbox_delayed, before the position
// moves past them, and sets the timer to the earliest of them.
func (r *Relay) setAside(ctx context.Context, conn *sql.Conn, s *session, rows []delayedRow) error {
	offsets, txIDs, topics, dues := make([]int64, len(rows)), make([]string, len(rows)), make([]string, len(rows)), make([]time.Time, len(rows))
	for i, d := range rows {
		offsets[i], txIDs[i], topics[i], dues[i] = d.row.offset, d.row.txID, d.topic, d.due
		if s.delayedDue.IsZero() || d.due.Before(s.delayedDue) {
			s.delayedDue = d.due
		}
	}
	res, err := conn.ExecContext(ctx, r.q.delay, r.config.Name, offsets, txIDs, topics, dues)
	if err != nil {
		return fmt.Errorf("outbox: set aside %d delayed row(s): %w", len(rows), err)
	}
	n, _ := res.RowsAffected()
	r.delayed.Add(uint64(n))
	return nil
}

// readDelayedDue sets the timer to the earliest row in outbox_delayed (zero: none).
func (r *Relay) readDelayedDue(ctx context.Context, conn *sql.Conn, s *session) error {
	var due sql.NullTime
	if err := conn.QueryRowContext(ctx, r.q.delayedDue, r.replanned(r.config.Name)...).Scan(&due); err != nil {
		if pgtx.IsUndefinedTable(err) {
			return fmt.Errorf("outbox: table outbox_delayed is missing (migration 014): run the migrations (migrate.Migrate or `wmonce migrate up`): %w", err)
		}
		return fmt.Errorf("outbox: read the next delayed row: %w", err)
	}
	s.delayedDue = due.Time
	return nil
}

// drainDelayed publishes up to one batch of the delayed rows that are due, earliest first, and
// returns how many it published, rejected or moved to outbox_held. Due rows of a held topic,
// and those the publisher fails for, join the topic's held rows: from then on they wait as
// any row of a failing topic does.
func (r *Relay) drainDelayed(ctx context.Context, conn *sql.Conn, s *session) (int, error) {
	now := time.Now()
	if s.delayedDue.IsZero() || s.delayedDue.After(now) {
		return 0, nil
	}
	rows, topics, err := r.readDue(ctx, conn, now)
	if err != nil {
		return 0, err
	}
	done := 0
	for _, topic := range topics {
		n, err := r.drainDueTopic(ctx, conn, s, topic, rows[topic])
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, r.readDelayedDue(ctx, conn, s)
}

// drainDueTopic publishes the due rows of one topic and returns how many it published, rejected
// or moved to outbox_held: all of them behind the topic's held rows while it is held, and from
// the first failing one on when the publisher fails.
func (r *Relay) drainDueTopic(ctx context.Context, conn *sql.Conn, s *session, topic string, run *run) (int, error) {
	if _, held := s.held[topic]; held {
		if err := r.holdDelayed(ctx, conn, s, topic, run.rows, nil); err != nil {
			return 0, err
		}
		return len(run.rows), nil
	}
	_, rest, cause, err := r.publishOrReject(ctx, conn, topic, run.rows, run.msgs)
	if rest > 0 { // published or rejected: they leave outbox_delayed, even if ctx ended meanwhile
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
		_, derr := conn.ExecContext(actx, r.q.delayedDelete, r.config.Name, seqs(run.rows[:rest]))
		cancel()
		if derr != nil {
			return 0, fmt.Errorf("outbox: remove published rows from outbox_delayed: %w", derr)
		}
	}
	if err != nil || cause == nil {
		return rest, err
	}
	if err := r.holdDelayed(ctx, conn, s, topic, run.rows[rest:], cause); err != nil {
		return rest, err
	}
	return len(run.rows), nil
}

// readDue reads up to BatchSize due rows of outbox_delayed, grouped by topic (topics in the
// order of their earliest row, each topic's rows earliest first). A row that no longer decodes
// (edited by hand) is rejected and removed.
func (r *Relay) readDue(ctx context.Context, conn *sql.Conn, now time.Time) (map[string]*run, []string, error) {
	all, err := readCopies(ctx, conn, r.q.delayedRead, r.replanned(r.config.Name, now, r.config.BatchSize)...)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: read due delayed rows: %w", err)
	}
	byTopic := map[string]*run{}
	var topics []string
	for _, row := range all {
		topic, msg, err := unmarshalEnvelope([]byte(row.payload))
		if err != nil {
			if err := r.reject(ctx, conn, row, "", err); err != nil {
				return nil, nil, err
			}
			if _, err := conn.ExecContext(ctx, r.q.delayedDelete, r.config.Name, []int64{row.seq}); err != nil {
				return nil, nil, fmt.Errorf("outbox: remove rejected row from outbox_delayed: %w", err)
			}
			continue
		}
		t := byTopic[topic]
		if t == nil {
			t = &run{topic: topic}
			byTopic[topic] = t
			topics = append(topics, topic)
		}
		t.rows, t.msgs = append(t.rows, row), append(t.msgs, msg)
	}
	return byTopic, topics, nil
}

// holdDelayed moves due rows of outbox_delayed behind topic's held rows (see hold).
func (r *Relay) holdDelayed(ctx context.Context, conn *sql.Conn, s *session, topic string, rows []outboxRow, cause error) error {
	return r.holdWith(ctx, conn, s, topic, rows, cause, r.q.delayedHold, r.config.Name, topic, seqs(rows))
}

func seqs(rows []outboxRow) []int64 {
	out := make([]int64, len(rows))
	for i, row := range rows {
		out[i] = row.seq
	}
	return out
}
