package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testsignal"
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
	sa, sb := initSignals(a), initSignals(b)
	done := make(chan error, 2)
	for _, j := range []*retention.Janitor{a, b} {
		go func() { done <- j.Run(context.Background()) }()
	}
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })

	// Several rounds of whichever leads.
	leader, standby, ls, ss := a, b, sa, sb
	if firstLeading(t, sa, sb) == sb {
		leader, standby, ls, ss = b, a, sb, sa
	}
	for range 5 {
		ls.RoundFinished.WaitOrTimeout()
	}
	require.True(t, leader.Counters().IsLeader)
	require.False(t, standby.Counters().IsLeader)
	require.Zero(t, standby.Counters().Rounds, "the standby deletes nothing while another instance leads")

	// Rows expired meanwhile are deleted by the leader's next rounds.
	insertClaims(t, db, schema, "c", 10, 30*day)
	waitDeletedClaims(t, ls, 10)
	require.Zero(t, countClaims(t, db, schema, "c"))

	// The leader stops; the standby takes over within a PollInterval or so.
	require.NoError(t, leader.Close())
	require.NoError(t, <-done)
	require.False(t, leader.Counters().IsLeader)
	ss.Leading.WaitOrTimeout()
	ss.RoundFinished.WaitOrTimeout()
	require.True(t, standby.Counters().IsLeader)
	insertClaims(t, db, schema, "c", 10, 30*day)
	waitDeletedClaims(t, ss, 10)
	require.Zero(t, countClaims(t, db, schema, "c"))
	require.NoError(t, standby.Close())
	require.NoError(t, <-done)
	require.NoError(t, standby.Close(), "Close is idempotent")
}

// initSignals initialises every test signal of j, before it runs.
func initSignals(j *retention.Janitor) *retention.JanitorTestSignals {
	s := j.TestSignals()
	s.Leading.Init()
	s.LeadFailed.Init()
	s.RoundFinished.Init()
	return s
}

// firstLeading returns the signals of whichever of two janitors takes the lead next.
func firstLeading(t *testing.T, a, b *retention.JanitorTestSignals) *retention.JanitorTestSignals {
	t.Helper()
	select {
	case <-a.Leading.C():
		return a
	case <-b.Leading.C():
		return b
	case <-time.After(testsignal.Timeout):
		t.Fatalf("no janitor took the lead within %s", testsignal.Timeout)
		return nil
	}
}

// waitDeletedClaims waits for the rounds of s that delete n claims in all.
func waitDeletedClaims(t *testing.T, s *retention.JanitorTestSignals, n int64) {
	t.Helper()
	for deleted := int64(0); deleted < n; {
		deleted += s.RoundFinished.WaitOrTimeout().Claims
	}
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
	sa, sb := initSignals(a), initSignals(b)
	done := make(chan error, 2)
	for _, j := range []*retention.Janitor{a, b} {
		go func() { done <- j.Run(context.Background()) }()
	}
	leading := firstLeading(t, sa, sb)
	first := holder()
	require.NotZero(t, first, "the leader holds the lock")
	pgtest.Exec(t, db, `SELECT pg_terminate_backend($1)`, first)

	// The leader learns it at its next use of the connection and steps down. The server
	// released the lock with the session; some instance leads again on a new session, and the
	// flags agree with the lock: exactly one leader.
	require.ErrorContains(t, leading.LeadFailed.WaitOrTimeout(), "leadership connection lost")
	firstLeading(t, sa, sb)
	pid := holder()
	require.NotZero(t, pid)
	require.NotEqual(t, first, pid)
	require.NotEqual(t, a.Counters().IsLeader, b.Counters().IsLeader)
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
	sig := initSignals(service)
	done := make(chan error, 1)
	go func() { done <- service.Run(context.Background()) }()
	// Its first round runs as it starts leading; the next is an hour away.
	sig.Leading.WaitOrTimeout()
	sig.RoundFinished.WaitOrTimeout()
	require.True(t, service.Counters().IsLeader)

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

	sig := initSignals(j)
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- j.Run(ctx) }()
	sig.RoundFinished.WaitOrTimeout()
	require.ErrorContains(t, j.Run(context.Background()), "already running")
	cancel()
	require.NoError(t, <-first)

	// Rounds of the first Run may still be unread: wait for one the counters say is new.
	rounds := j.Counters().Rounds
	second := make(chan error, 1)
	go func() { second <- j.Run(context.Background()) }()
	sig.RoundFinished.WaitFor(func(retention.Report) bool { return j.Counters().Rounds > rounds })
	require.NoError(t, j.Close())
	require.NoError(t, <-second, "Close stopped the second Run and waited for it")
	require.False(t, j.Counters().IsLeader, "the lock is given up")
	require.NoError(t, j.Run(context.Background()), "Run after Close returns at once")
}
