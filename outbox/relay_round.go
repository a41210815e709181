package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/pgtx"
)

// recordTimeout bounds the position update after a publish, which outlives a cancelled context.
const recordTimeout = 5 * time.Second

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

// round publishes one batch and returns how many rows it published, held, rejected or passed
// over, and its snapshot; with ask, its position read asks the Writers to notify the relay
// (wakeup). A round is the set of transactions that committed between the relay's previous
// snapshot and a new one, published in "offset" (insertion) order; a round larger than
// BatchSize is published over several calls. The position advances after each run of one
// topic that published, so a crash republishes at most one batch.
func (r *Relay) round(ctx context.Context, conn *sql.Conn, s *session, ask bool) (_ int, _ string, err error) {
	var st roundState
	defer func() {
		if err == nil {
			r.testSignals.RoundDone.Signal(st.published)
		}
	}()
	pos, err := r.readPosition(ctx, conn, s, ask)
	if err != nil || s.paused {
		return 0, "", err
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
	st = roundState{pos: pos, snap: snap, rows: rows, more: more}
	for start := 0; start < len(rows); {
		if start, err = r.forwardRun(ctx, conn, s, &st, start); err != nil {
			return st.published, snap, err
		}
	}
	r.lastRelay.SetNow()
	return len(rows), snap, r.checkSources(ctx, conn, s)
}

// readPosition reads the relay's position and whether it is paused (into s); with ask, the
// read asks the Writers to notify the relay.
func (r *Relay) readPosition(ctx context.Context, conn *sql.Conn, s *session, ask bool) (position, error) {
	var pos position
	query, args := r.q.position, []any{r.config.Name}
	if ask {
		query, args = r.q.positionIdle, append(args, idleTTL(r.config.PollInterval).Microseconds())
	}
	if err := conn.QueryRowContext(ctx, query, args...).Scan(&pos.prev, &pos.target, &pos.last, &s.paused); err != nil {
		return pos, fmt.Errorf("outbox: read relay position: %w", err)
	}
	r.notePaused(s.paused)
	return pos, nil
}

// roundState is a round's batch as round forwards it run by run.
type roundState struct {
	pos       position // recorded after the last run forwarded
	snap      string   // the round's snapshot
	rows      []outboxRow
	more      bool // the round has rows beyond rows
	published int  // messages the broker accepted so far
}

// forwardRun forwards the run of st.rows from start (setting aside the rows not due yet) and
// records the position after it; it returns where the next run starts.
func (r *Relay) forwardRun(ctx context.Context, conn *sql.Conn, s *session, st *roundState, start int) (int, error) {
	run, end, err := r.decodeRun(ctx, conn, s, st.rows, start)
	if err != nil {
		return end, err
	}
	if len(run.delayed) > 0 {
		if err := r.setAside(ctx, conn, s, run.delayed); err != nil {
			return end, err
		}
	}
	if len(run.msgs) > 0 {
		n, err := r.forward(ctx, conn, s, run)
		st.published += n
		if err != nil {
			return end, err
		}
	}
	next := position{
		prev:   st.pos.prev,
		target: sql.NullString{String: st.snap, Valid: true},
		last:   sql.NullInt64{Int64: st.rows[end-1].offset, Valid: true},
	}
	if end == len(st.rows) && !st.more {
		next = position{prev: st.snap} // the round is complete
	}
	// What the broker accepted is recorded even if ctx ends meanwhile (Close), so that a
	// clean stop does not publish it again; the wait for that one UPDATE is bounded.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	err = r.advance(actx, conn, st.pos, next, st.published > 0)
	cancel()
	if err != nil {
		return end, err
	}
	st.pos = next
	return end, nil
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
	snap := pos.target.String
	var query string
	var args []any
	if pos.target.Valid {
		query, args = r.q.readRest, r.replanned(pos.prev, pos.target.String, pos.last.Int64, r.config.BatchSize+1, r.config.Source)
	} else {
		query, args = r.q.readRound, r.replanned(pos.prev, r.config.BatchSize+1, r.config.Source)
	}
	out := make([]outboxRow, 0, r.config.BatchSize+1)
	err := pgtx.QueryEach(ctx, conn, func(s pgtx.Scanner) error {
		var row outboxRow
		var offset sql.NullInt64
		var txID, uuid, source, payload sql.NullString
		dest := []any{&offset, &txID, &uuid, &source, &payload, &row.metadata}
		if !pos.target.Valid {
			dest = append([]any{&snap}, dest...)
		}
		// No offset: relayQueries.readRound's row for an empty round, the snapshot alone.
		if err := s.Scan(dest...); err != nil || !offset.Valid {
			return err
		}
		row.offset, row.txID, row.uuid, row.payload = offset.Int64, txID.String, uuid.String, payload.String
		row.source, row.mine = source.String, source.String == r.config.Source
		out = append(out, row)
		return nil
	}, query, args...)
	if err != nil {
		return "", nil, fmt.Errorf("outbox: read outbox: %w", err)
	}
	return snap, out, nil
}

// run is a run of rows of the relay's Source for one topic, with their decoded messages
// (rows[i] holds msgs[i]), and the rows among them, of any topic, that are not due yet.
type run struct {
	topic   string
	rows    []outboxRow
	msgs    []*message.Message
	delayed []delayedRow
}

// decodeRun decodes rows from start while they share a destination topic, passing over rows
// of other sources. Rows that cannot be decoded are set aside in outbox_rejected; the run ends
// before the first row of another topic. Rows not due yet (delay.go), whatever their topic,
// are collected apart and do not end the run: they are set aside, not published.
func (r *Relay) decodeRun(ctx context.Context, conn *sql.Conn, s *session, rows []outboxRow, start int) (run, int, error) {
	var out run
	now := time.Now()
	i := start
	for ; i < len(rows); i++ {
		if !rows[i].mine {
			r.otherSource.Add(1)
			s.sawSource(rows[i].source)
			continue
		}
		t, msg, err := unmarshalEnvelope([]byte(rows[i].payload))
		if err != nil {
			if len(out.msgs) > 0 || len(out.delayed) > 0 {
				break // publish what we have first, so the rejection is recorded in order
			}
			if err := r.reject(ctx, conn, rows[i], "", err); err != nil {
				return run{}, 0, err
			}
			return run{}, i + 1, nil
		}
		if due, later := r.dueLater(msg, now); later {
			out.delayed = append(out.delayed, delayedRow{row: rows[i], topic: t, due: due})
			continue
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
	// An empty payload or topic is stored as NULL (nullif), as a NULL metadata stays NULL.
	if _, err := conn.ExecContext(ctx, r.q.reject, r.config.Name, row.offset, row.txID, row.uuid, row.payload, row.metadata, cause.Error(), topic, row.source); err != nil {
		return fmt.Errorf("outbox: record rejected row %s: %w", row.uuid, err)
	}
	r.rejected.Add(1)
	r.testSignals.RowRejected.Signal(row.uuid)
	why, fields := "Outbox row rejected: it cannot be decoded; set aside in outbox_rejected", watermill.LogFields{"uuid": row.uuid, "offset": row.offset}
	if topic != "" {
		why, fields["topic"] = "Outbox row rejected: the broker refuses it for good; set aside in outbox_rejected, the rows behind it go on", topic
	}
	r.logger.Error(why, cause, fields)
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
	res, err := conn.ExecContext(ctx, r.q.advance, r.config.Name, to.prev, to.target, to.last, from.prev, from.target, from.last, published)
	if err != nil {
		return fmt.Errorf("outbox: record relay position: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		r.fenced.Add(1)
		return errors.New("outbox: relay position was moved by another relay instance; re-reading it")
	}
	return nil
}
