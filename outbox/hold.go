package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/pgtx"
)

// What the relay does when the publisher fails (docs/outbox-relay.md, When the broker refuses a message or a topic):
//   - a transient failure holds the run's topic: its rows are copied into outbox_held, the
//     position moves on, and every later row of that topic is copied behind them, while the
//     other topics go on; the held rows are published in the order they were held, with
//     backoff, and the topic is released once none is left;
//   - a refusal for good (RelayConfig.IsPermanent) rejects the refused message alone: it is
//     copied into outbox_rejected and the rows behind it go on, later rows of its key included.

// session is what a relay keeps while it leads, or for one RelayOnce: the topics it holds,
// and the other sources it has seen.
type session struct {
	held    map[string]*heldTopic
	sources map[string]sourceSeen
	// delayedDue is when the earliest row in outbox_delayed is due (zero: none): the relay's
	// timer for delayed rows, read when the session starts and after each drain of due rows,
	// and brought forward by every row set aside.
	delayedDue time.Time
	// paused: the last position read found the relay paused (pause.go).
	paused bool
}

// heldTopic is a topic whose rows wait in outbox_held.
type heldTopic struct {
	backoff worker.Backoff
	due     time.Time // next try
}

// sourceSeen is another source whose rows the relay passed over.
type sourceSeen struct {
	next time.Time // when to ask again whether some relay forwards it
	seen bool      // rows seen since the relay last asked
}

// sourceRecheck is how often a relay asks again whether a source it passes over, and that no
// relay forwarded when it last asked, has a relay now (logging an error each time it has not);
// a source that has one is asked about again after sourceRecheckServed.
const (
	sourceRecheck       = time.Minute
	sourceRecheckServed = 10 * time.Minute
)

// newSession reads the topics this relay holds: a relay that took over holds what its
// predecessor held, and tries each of them at once.
func (r *Relay) newSession(ctx context.Context, conn *sql.Conn) (*session, error) {
	s := &session{held: map[string]*heldTopic{}, sources: map[string]sourceSeen{}}
	err := pgtx.QueryEach(ctx, conn, func(row pgtx.Scanner) error {
		var topic string
		err := row.Scan(&topic)
		s.held[topic] = r.newHeldTopic()
		return err
	}, r.q.heldTopics, r.replanned(r.config.Name)...)
	if err != nil {
		return nil, fmt.Errorf("outbox: read held topics: %w", err)
	}
	r.heldTopics.Store(int64(len(s.held)))
	if err := r.readDelayedDue(ctx, conn, s); err != nil {
		return nil, err
	}
	return s, nil
}

func (r *Relay) newHeldTopic() *heldTopic {
	return &heldTopic{backoff: worker.Backoff{Base: r.config.Backoff, Max: r.config.MaxBackoff}}
}

// nextDue returns when the next held topic is to be tried or the next delayed row is due, if
// there is any.
func (s *session) nextDue() (time.Time, bool) {
	next, ok := s.delayedDue, !s.delayedDue.IsZero()
	for _, h := range s.held {
		if !ok || h.due.Before(next) {
			next, ok = h.due, true
		}
	}
	return next, ok
}

func (s *session) sawSource(source string) {
	seen := s.sources[source]
	seen.seen = true
	s.sources[source] = seen
}

// forward publishes a run of one topic, or holds it: because the topic is held already, or
// because publishing it failed. It returns how many messages the publisher accepted.
func (r *Relay) forward(ctx context.Context, conn *sql.Conn, s *session, run run) (int, error) {
	if _, held := s.held[run.topic]; held {
		return 0, r.hold(ctx, conn, s, run.topic, run.rows, nil)
	}
	published, rest, cause, err := r.publishOrReject(ctx, conn, run.topic, run.rows, run.msgs)
	if err != nil || rest == len(run.rows) {
		return published, err
	}
	return published, r.hold(ctx, conn, s, run.topic, run.rows[rest:], cause)
}

// publishOrReject publishes msgs (rows[i] holds msgs[i]). When the publisher refuses them for
// good, it publishes them again one at a time, rejecting each it refuses for good, so that one
// bad message holds back nothing else. It stops at a transient failure: rest is the index of
// the first message neither published nor rejected (len(msgs) when none is left), cause the
// failure. err is a database error or the end of ctx: the caller stops there.
func (r *Relay) publishOrReject(ctx context.Context, conn *sql.Conn, topic string, rows []outboxRow, msgs []*message.Message) (published, rest int, cause, err error) {
	failed := r.publishLanes(ctx, topic, msgs)
	if failed == nil {
		r.forwarded.Add(uint64(len(msgs)))
		return len(msgs), len(msgs), nil, nil
	}
	if ctx.Err() != nil {
		return 0, 0, nil, ctx.Err()
	}
	r.failures.Add(1)
	if !r.permanent(failed) {
		return 0, 0, failed, nil
	}
	if len(msgs) == 1 {
		return 0, 1, nil, r.reject(ctx, conn, rows[0], topic, failed)
	}
	for i := range msgs {
		failed := r.publish(ctx, topic, msgs[i:i+1])
		switch {
		case failed == nil:
			published++
			r.forwarded.Add(1)
		case ctx.Err() != nil:
			return published, i, nil, ctx.Err()
		case !r.permanent(failed):
			r.failures.Add(1)
			return published, i, failed, nil
		default:
			r.failures.Add(1)
			if err := r.reject(ctx, conn, rows[i], topic, failed); err != nil {
				return published, i, nil, err
			}
		}
	}
	return published, len(msgs), nil, nil
}

// permanent reports whether err refuses the messages for good: RelayConfig.IsPermanent, except
// that the end of a context, a timeout and a lost connection never are.
func (r *Relay) permanent(err error) bool {
	return !neverPermanent(err) && r.config.IsPermanent(err)
}

func neverPermanent(err error) bool {
	var netErr net.Error
	for _, target := range []error{context.Canceled, context.DeadlineExceeded, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE, syscall.ETIMEDOUT} {
		if errors.Is(err, target) {
			return true
		}
	}
	return errors.As(err, &netErr) || pgtx.IsConnectionError(err)
}

// hold copies rows of topic into outbox_held behind those held before. With a cause, the
// topic has just failed: from now on its rows wait there until it accepts messages again.
func (r *Relay) hold(ctx context.Context, conn *sql.Conn, s *session, topic string, rows []outboxRow, cause error) error {
	offsets := make([]int64, len(rows))
	txIDs := make([]string, len(rows))
	for i, row := range rows {
		offsets[i], txIDs[i] = row.offset, row.txID
	}
	return r.holdWith(ctx, conn, s, topic, rows, cause, r.q.hold, r.config.Name, topic, offsets, txIDs)
}

// holdWith is hold, with the statement that copies the rows (from the outbox, or from
// outbox_delayed) and its arguments.
func (r *Relay) holdWith(ctx context.Context, conn *sql.Conn, s *session, topic string, rows []outboxRow, cause error, query string, args ...any) error {
	res, err := conn.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("outbox: hold %d row(s) of topic %q: %w", len(rows), topic, err)
	}
	n, _ := res.RowsAffected()
	r.held.Add(uint64(n))
	if cause == nil {
		return nil
	}
	h := r.newHeldTopic()
	wait := h.backoff.Next()
	h.due = time.Now().Add(wait)
	s.held[topic] = h
	r.heldTopics.Store(int64(len(s.held)))
	r.testSignals.TopicHeld.Signal(topic)
	r.logger.Error("Relay holds topic: publishing to it failed; its rows wait in outbox_held and are retried with backoff, the other topics go on", cause,
		watermill.LogFields{"topic": topic, "rows": len(rows), "first_uuid": rows[0].uuid, "backoff": wait})
	return nil
}

// drainHeld tries every held topic whose wait is over, in topic order, and returns how many
// held rows it published or rejected.
func (r *Relay) drainHeld(ctx context.Context, conn *sql.Conn, s *session) (int, error) {
	topics := make([]string, 0, len(s.held))
	now := time.Now()
	for topic, h := range s.held {
		if !h.due.After(now) {
			topics = append(topics, topic)
		}
	}
	slices.Sort(topics)
	done := 0
	for _, topic := range topics {
		n, err := r.drainTopic(ctx, conn, s, topic)
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// decodeHeld decodes held rows into a run to publish. Held rows were decoded when they were
// held; one that no longer decodes (edited by hand) is rejected like any other, and returned
// apart so that it leaves outbox_held too.
func (r *Relay) decodeHeld(ctx context.Context, conn *sql.Conn, rows []outboxRow) (out run, undecodable []outboxRow, err error) {
	for _, row := range rows {
		_, msg, err := unmarshalEnvelope([]byte(row.payload))
		if err == nil {
			out.rows, out.msgs = append(out.rows, row), append(out.msgs, msg)
			continue
		}
		if err := r.reject(ctx, conn, row, "", err); err != nil {
			return run{}, nil, err
		}
		undecodable = append(undecodable, row)
	}
	return out, undecodable, nil
}

// drainTopic publishes up to one batch of topic's held rows, oldest first. When every held row
// of the topic is gone, the topic is released: its next rows are published directly.
func (r *Relay) drainTopic(ctx context.Context, conn *sql.Conn, s *session, topic string) (int, error) {
	rows, err := r.readHeld(ctx, conn, topic)
	if err != nil {
		return 0, err
	}
	more := len(rows) > r.config.BatchSize
	if more {
		rows = rows[:r.config.BatchSize]
	}
	run, undecodable, err := r.decodeHeld(ctx, conn, rows)
	if err != nil {
		return 0, err
	}
	var published, rest int
	var cause error
	if len(run.msgs) > 0 {
		published, rest, cause, err = r.publishOrReject(ctx, conn, topic, run.rows, run.msgs)
	}
	// What went out or was rejected leaves outbox_held, even if ctx ended meanwhile.
	gone := slices.Concat(undecodable, run.rows[:rest])
	if len(gone) > 0 {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
		derr := r.deleteHeld(actx, conn, gone)
		cancel()
		if derr != nil {
			return published, derr
		}
	}
	if err != nil {
		return published, err
	}
	h := s.held[topic]
	if cause != nil {
		wait := h.backoff.Next()
		h.due = time.Now().Add(wait)
		r.logger.Error("Relay publish failed for a held topic; its rows stay in outbox_held", cause,
			watermill.LogFields{"topic": topic, "first_uuid": run.rows[rest].uuid, "backoff": wait})
		return len(gone), nil
	}
	if !more {
		delete(s.held, topic)
		r.heldTopics.Store(int64(len(s.held)))
		r.logger.Info("Relay released topic: its held rows are published", watermill.LogFields{"topic": topic})
		r.testSignals.TopicReleased.Signal(topic)
	} else {
		h.backoff.Reset()
		h.due = time.Time{} // the next batch at once
	}
	return len(gone), nil
}

func (r *Relay) readHeld(ctx context.Context, conn *sql.Conn, topic string) ([]outboxRow, error) {
	rows, err := readCopies(ctx, conn, r.q.heldRead, r.replanned(r.config.Name, topic, r.config.BatchSize+1)...)
	if err != nil {
		return nil, fmt.Errorf("outbox: read held rows of %q: %w", topic, err)
	}
	return rows, nil
}

// readCopies reads rows copied out of the outbox (outbox_held, outbox_delayed): seq, offset,
// transaction id, uuid, source, payload and metadata, all of the relay's Source.
func readCopies(ctx context.Context, conn *sql.Conn, query string, args ...any) ([]outboxRow, error) {
	return pgtx.QueryAll(ctx, conn, scanCopy, query, args...)
}

func scanCopy(s pgtx.Scanner) (outboxRow, error) {
	var row outboxRow
	var payload sql.NullString
	if err := s.Scan(&row.seq, &row.offset, &row.txID, &row.uuid, &row.source, &payload, &row.metadata); err != nil {
		return outboxRow{}, err
	}
	row.payload, row.mine = payload.String, true
	return row, nil
}

func (r *Relay) deleteHeld(ctx context.Context, conn *sql.Conn, rows []outboxRow) error {
	seqs := make([]int64, len(rows))
	for i, row := range rows {
		seqs[i] = row.seq
	}
	if _, err := conn.ExecContext(ctx, r.q.heldDelete, r.config.Name, seqs); err != nil {
		return fmt.Errorf("outbox: remove published rows from outbox_held: %w", err)
	}
	return nil
}

// checkSources asks, for each other source the relay passed over since it last asked (at most
// every sourceRecheck), whether some relay forwards it, and logs an error when none does: those
// rows are never published until a relay of their source runs.
func (r *Relay) checkSources(ctx context.Context, conn *sql.Conn, s *session) error {
	now := time.Now()
	for source, seen := range s.sources {
		if !seen.seen || now.Before(seen.next) {
			continue
		}
		var served bool
		if err := conn.QueryRowContext(ctx, r.q.served, source).Scan(&served); err != nil {
			return fmt.Errorf("outbox: look for the relay of source %q: %w", source, err)
		}
		if served {
			s.sources[source] = sourceSeen{next: now.Add(sourceRecheckServed)}
			continue
		}
		s.sources[source] = sourceSeen{next: now.Add(sourceRecheck)}
		r.logger.Error("Outbox rows of another source have no relay: nothing publishes them until a relay with that RelayConfig.Source runs", nil,
			watermill.LogFields{"source": source, "this_relay_source": r.config.Source, "schema": r.config.Schema})
	}
	return nil
}
