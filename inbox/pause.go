package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/pgtx"
)

// Pause (docs/inbox.md, Delayed messages and pausing): a row of inbox_paused (migration 014) per paused
// consumer, read by every claim statement of its processors.

// Pause pauses consumer: from the moment it commits, no Processor of the consumer, in any
// process, claims a row (running attempts finish); the Receiver goes on storing. It lasts until
// Resume and reports whether the consumer was running.
func (o *Ops) Pause(ctx context.Context, consumer string) (bool, error) {
	if err := validateConsumer(consumer); err != nil {
		return false, fmt.Errorf("inbox: pause: %w", err)
	}
	var n int64
	err := o.db.QueryRowContext(ctx, `WITH ins AS (
    INSERT INTO `+o.pausedTable()+` (consumer) VALUES ($1) ON CONFLICT (consumer) DO NOTHING RETURNING 1)
SELECT count(*) FROM ins`, consumer).Scan(&n)
	if err != nil {
		return false, o.pauseError("pause", err)
	}
	if n > 0 {
		o.logger.Info("Inbox consumer paused", map[string]any{"consumer": consumer})
	}
	return n > 0, nil
}

// Resume undoes Pause and wakes the consumer's processors: LISTENing ones claim at once, the
// others within their PollInterval. It reports whether the consumer was paused.
func (o *Ops) Resume(ctx context.Context, consumer string) (bool, error) {
	if err := validateConsumer(consumer); err != nil {
		return false, fmt.Errorf("inbox: resume: %w", err)
	}
	var n int64
	err := o.db.QueryRowContext(ctx, `WITH del AS (
    DELETE FROM `+o.pausedTable()+` WHERE consumer = $1 RETURNING 1)
SELECT n FROM (SELECT count(*) AS n FROM del) c, LATERAL (SELECT CASE WHEN n > 0 THEN pg_notify($2::text, $1::text) END) w`,
		consumer, o.q.channel).Scan(&n)
	if err != nil {
		return false, o.pauseError("resume", err)
	}
	if n > 0 {
		o.logger.Info("Inbox consumer resumed", map[string]any{"consumer": consumer})
	}
	return n > 0, nil
}

// Paused returns every paused consumer with when it was paused. A schema older than migration
// 014 has none.
func (o *Ops) Paused(ctx context.Context) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	err := pgtx.QueryEach(ctx, o.db, func(s pgtx.Scanner) error {
		var c string
		var at time.Time
		err := s.Scan(&c, &at)
		out[c] = at
		return err
	}, `SELECT consumer, paused_at FROM `+o.pausedTable())
	if pgtx.IsUndefinedTable(err) {
		return map[string]time.Time{}, nil
	}
	if err != nil {
		return nil, o.pauseError("paused consumers", err)
	}
	return out, nil
}

func (o *Ops) pausedTable() string { return pgtx.QualifiedName(o.schema, "inbox_paused") }

func (o *Ops) pauseError(op string, err error) error {
	if pgtx.IsUndefinedTable(err) {
		return fmt.Errorf("inbox: %s: table %s is missing (migration 014): run the migrations (migrate.Migrate or `wmonce migrate up`): %w", op, o.pausedTable(), err)
	}
	return fmt.Errorf("inbox: %s: %w", op, err)
}
