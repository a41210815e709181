package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/pgtx"
)

func TestOneJanitorLeadsAndAnotherTakesOver(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	cfg := retention.Config{Schema: schema, PollInterval: 20 * time.Millisecond}
	a, b := newJanitor(t, db, cfg), newJanitor(t, db, cfg)
	done := make(chan error, 2)
	for _, j := range []*retention.Janitor{a, b} {
		go func() { done <- j.Run(context.Background()) }()
	}
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })

	// Wait for several rounds of whichever leads.
	testwait.Until(t, "five janitor rounds", func() bool { return a.Counters().Rounds+b.Counters().Rounds >= 5 })
	leader, standby := a, b
	if b.Counters().IsLeader {
		leader, standby = b, a
	}
	require.True(t, leader.Counters().IsLeader)
	require.False(t, standby.Counters().IsLeader)
	require.Zero(t, standby.Counters().Rounds, "the standby deletes nothing while another instance leads")

	// Rows expired meanwhile are deleted by the leader's next rounds.
	insertClaims(t, db, schema, "c", 10, 30*day)
	testwait.Until(t, "the claims to be pruned", func() bool { return countClaims(t, db, schema, "c") == 0 })

	// The leader stops; the standby takes over within a PollInterval or so.
	require.NoError(t, leader.Close())
	require.NoError(t, <-done)
	require.False(t, leader.Counters().IsLeader)
	testwait.Until(t, "the standby to lead and run a round", func() bool { return standby.Counters().IsLeader && standby.Counters().Rounds > 0 })
	insertClaims(t, db, schema, "c", 10, 30*day)
	testwait.Until(t, "the claims to be pruned again", func() bool { return countClaims(t, db, schema, "c") == 0 })
	require.NoError(t, standby.Close())
	require.NoError(t, <-done)
	require.NoError(t, standby.Close(), "Close is idempotent")
}

func TestLeaderWhoseConnectionDiesStepsDown(t *testing.T) {
	t.Parallel()
	db := pgtest.OpenDB(t, 6) // a pool of its own: a connection is killed on purpose
	schema := pgtest.Schema(t, db)
	classid, objid := worker.LockKeyParts(worker.LockKey("retention", schema))
	holder := func() int {
		var pid int
		err := db.QueryRow(`SELECT coalesce(max(pid), 0) FROM pg_locks WHERE locktype = 'advisory' AND granted
AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`, classid, objid).Scan(&pid)
		require.NoError(t, err)
		return pid
	}

	cfg := retention.Config{Schema: schema, PollInterval: 20 * time.Millisecond}
	a, b := newJanitor(t, db, cfg), newJanitor(t, db, cfg)
	done := make(chan error, 2)
	for _, j := range []*retention.Janitor{a, b} {
		go func() { done <- j.Run(context.Background()) }()
	}
	testwait.Until(t, "one janitor to hold the lock and lead", func() bool { return holder() != 0 && (a.Counters().IsLeader || b.Counters().IsLeader) })
	first := holder()
	pgtest.Exec(t, db, `SELECT pg_terminate_backend($1)`, first)

	// The server released the lock with the session; some instance leads again on a new
	// session, and the flags agree with the lock: exactly one leader.
	testwait.Until(t, "the other janitor to take over", func() bool {
		pid := holder()
		return pid != 0 && pid != first && a.Counters().IsLeader != b.Counters().IsLeader
	})
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.NoError(t, <-done)
	require.NoError(t, <-done)
}

func TestRunOnceWorksBesideARunningLeader(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	// The service janitor rounds rarely; the operator's RunOnce (wmonce purge --now) does not wait for it.
	service := newJanitor(t, db, retention.Config{Schema: schema, PollInterval: time.Hour})
	done := make(chan error, 1)
	go func() { done <- service.Run(context.Background()) }()
	// Its first round runs as it starts leading; the next is an hour away.
	testwait.Until(t, "the service to lead and finish its first round", func() bool {
		return service.Counters().IsLeader && service.Counters().Rounds >= 1
	})

	insertClaims(t, db, schema, "c", 20, 30*day)
	rep, err := newJanitor(t, db, retention.Config{Schema: schema}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(20), rep.Claims)
	require.NoError(t, service.Close())
	require.NoError(t, <-done)
}

func TestPurgeClaimsWithDryRun(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	insertClaims(t, db, schema, "a", 30, 3*day)
	insertClaims(t, db, schema, "a", 5, time.Hour)
	insertClaims(t, db, schema, "b", 40, 3*day)
	daily := pgtx.QualifiedName(schema, "processed_messages_daily")
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "processed_messages_20200101")+` PARTITION OF `+daily+` FOR VALUES FROM ('2020-01-01') TO ('2020-01-02')`)
	pgtest.Exec(t, db, `INSERT INTO `+daily+` (consumer, message_id, occurred_on, payload_sha256, processed_at)
SELECT 'b', 'd' || g, '2020-01-01', '\x00', now() - interval '3 days' FROM generate_series(1, 6) g`)
	var before time.Time
	require.NoError(t, db.QueryRow(`SELECT now() - interval '1 day'`).Scan(&before))

	n, err := retention.Purge(ctx, db, schema, retention.PurgeRequest{Consumer: "a", Before: before, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, int64(30), n)
	require.Equal(t, 35, countClaims(t, db, schema, "a"), "a dry run deletes nothing")

	n, err = retention.Purge(ctx, db, schema, retention.PurgeRequest{Consumer: "a", Before: before, BatchSize: 7})
	require.NoError(t, err)
	require.Equal(t, int64(30), n)
	require.Equal(t, 5, countClaims(t, db, schema, "a"))
	require.Equal(t, 40, countClaims(t, db, schema, "b"), "other consumers untouched")

	n, err = retention.Purge(ctx, db, schema, retention.PurgeRequest{Before: before, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, int64(46), n, "every consumer, both claim tables")
	n, err = retention.Purge(ctx, db, schema, retention.PurgeRequest{Before: before, BatchSize: 4})
	require.NoError(t, err)
	require.Equal(t, int64(46), n)
	require.Zero(t, countClaims(t, db, schema, "b"))
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+daily))
	require.Equal(t, 5, countClaims(t, db, schema, "a"))

	_, err = retention.Purge(ctx, db, schema, retention.PurgeRequest{Consumer: "a"})
	require.ErrorContains(t, err, "give Before")
	_, err = retention.Purge(ctx, db, "no-such schema", retention.PurgeRequest{Before: before})
	require.ErrorContains(t, err, "schema name")
	_, err = retention.Purge(ctx, db, schema, retention.PurgeRequest{Before: before, BatchSize: -1})
	require.ErrorContains(t, err, "BatchSize")
}

// The Run/Close rules of every worker (internal/worker.Runner): one Run at a time, Run again
// after it returned, Close final.
func TestJanitorRunAgainAfterItReturnedAndCloseIsFinal(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	j := newJanitor(t, db, retention.Config{Schema: schema, PollInterval: 20 * time.Millisecond})

	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- j.Run(ctx) }()
	testwait.Until(t, "a janitor round", func() bool { return j.Counters().Rounds > 0 })
	require.ErrorContains(t, j.Run(context.Background()), "already running")
	cancel()
	require.NoError(t, <-first)

	rounds := j.Counters().Rounds
	second := make(chan error, 1)
	go func() { second <- j.Run(context.Background()) }()
	testwait.Until(t, "a round of the second Run", func() bool { return j.Counters().Rounds > rounds })
	require.NoError(t, j.Close())
	require.NoError(t, <-second, "Close stopped the second Run and waited for it")
	require.False(t, j.Counters().IsLeader, "the lock is given up")
	require.NoError(t, j.Run(context.Background()), "Run after Close returns at once")
}
