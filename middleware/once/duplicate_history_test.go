package once_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/claims"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// Duplicates are recorded per consumer and minute in the database, so that any process can
// chart them: a storm in one minute is one row, a payload mismatch counts too, and two
// processes' duplicates of one minute add up. What Close finds pending is written; without
// Close, the write follows within a second.
func TestDuplicatesArePersistedPerMinute(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 12, 0, 10, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	setNow := func(t time.Time) { mu.Lock(); defer mu.Unlock(); now = t }
	noop := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "c", Now: clock}, nil)
	require.NoError(t, err)
	h := mw.Middleware(noop)

	require.NoError(t, deliver(h, "e-1", "p"))
	for range 30 {
		require.NoError(t, deliver(h, "e-1", "p"))
	}
	setNow(now.Add(time.Minute))
	for range 5 {
		require.NoError(t, deliver(h, "e-1", "p"))
	}
	require.NoError(t, deliver(h, "e-1", "another payload"), "a mismatch is skipped (and logged) by default")
	require.NoError(t, mw.Close())

	// Another process's middleware, same consumer, same minute.
	other, err := once.New(db, once.Config{Schema: schema, Consumer: "c", Now: clock}, nil)
	require.NoError(t, err)
	oh := other.Middleware(noop)
	require.NoError(t, deliver(oh, "e-1", "p"))
	require.NoError(t, deliver(oh, "e-1", "p"))
	require.NoError(t, other.Close())

	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	got, err := claims.DuplicateHistory(ctx, db, schema, "", start, time.Minute, 3)
	require.NoError(t, err)
	require.Equal(t, map[string][]int64{"c": {30, 8, 0}}, got)
	day, err := claims.DuplicateHistory(ctx, db, schema, "c", start, 15*time.Minute, 1)
	require.NoError(t, err)
	require.Equal(t, map[string][]int64{"c": {38}}, day)
	none, err := claims.DuplicateHistory(ctx, db, schema, "nobody", start, time.Minute, 3)
	require.NoError(t, err)
	require.Empty(t, none)
	table := pgtx.QualifiedName(schema, "duplicates_per_minute")
	require.Equal(t, 2, pgtest.Count(t, db, `SELECT count(*) FROM `+table), "one row per consumer and minute")
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT mismatches FROM `+table+` WHERE minute = $1`, start.Add(time.Minute)))

	// No Close: the pending count is written within a second.
	setNow(start.Add(2 * time.Minute))
	third, err := once.New(db, once.Config{Schema: schema, Consumer: "c", Now: clock}, nil)
	require.NoError(t, err)
	require.NoError(t, deliver(third.Middleware(noop), "e-1", "p"))
	testwait.Until(t, "the duplicate written without Close", func() bool {
		got, err := claims.DuplicateHistory(ctx, db, schema, "c", start, time.Minute, 3)
		return err == nil && got["c"][2] == 1
	})

	_, err = claims.DuplicateHistory(ctx, db, schema, "c", start, 0, 3)
	require.ErrorContains(t, err, "width must be positive")

	// A minute is kept two days (the admin page's longest window is one) by the clock that stamped it (Config.Now), so this
	// test means the same on any date: just under the limit every minute stays; 3 minutes past
	// it the first three go, and the new one stays.
	const duplicateHistoryKeep = 48 * time.Hour
	flushAt := func(at time.Time) {
		t.Helper()
		setNow(at)
		mw, err := once.New(db, once.Config{Schema: schema, Consumer: "c", Now: clock}, nil)
		require.NoError(t, err)
		require.NoError(t, deliver(mw.Middleware(noop), "e-1", "p"))
		require.NoError(t, mw.Close())
	}
	flushAt(start.Add(duplicateHistoryKeep - time.Minute))
	require.Equal(t, 4, pgtest.Count(t, db, `SELECT count(*) FROM `+table), "nothing is older than two days by the middleware's clock")
	flushAt(start.Add(duplicateHistoryKeep + 3*time.Minute))
	var left []time.Time
	require.NoError(t, pgtx.QueryEach(ctx, db, func(row pgtx.Scanner) error {
		var m time.Time
		err := row.Scan(&m)
		left = append(left, m.UTC())
		return err
	}, `SELECT minute FROM `+table+` ORDER BY minute`))
	require.Equal(t, []time.Time{start.Add(duplicateHistoryKeep - time.Minute), start.Add(duplicateHistoryKeep + 3*time.Minute)}, left)
}
