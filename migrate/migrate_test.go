package migrate_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/pgtx"
)

func TestMigrateUpDownAndConcurrentInstances(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	schema := pgtest.NewName("mig")
	t.Cleanup(func() { pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(schema)+` CASCADE`) })

	// Eight instances starting at once: every migration is applied exactly once.
	var wg sync.WaitGroup
	applied := make([][]int, 8)
	errs := make([]error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
			if err != nil {
				errs[i] = err
				return
			}
			res, err := m.Migrate(ctx, migrate.DirectionUp, nil)
			applied[i], errs[i] = res.Versions, err
		}()
	}
	wg.Wait()
	total := 0
	for i := range 8 {
		require.NoError(t, errs[i])
		total += len(applied[i])
	}
	require.Equal(t, migrate.Latest(), total, "each migration applied once across all instances")

	m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
	require.NoError(t, err)
	v, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, migrate.Latest(), v)
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'processed_messages'`, schema))

	// A bare down reverts one step only.
	res, err := m.Migrate(ctx, migrate.DirectionDown, nil)
	require.NoError(t, err)
	require.Equal(t, []int{migrate.Latest()}, res.Versions)
	// A down with a target goes all the way to it.
	res, err = m.Migrate(ctx, migrate.DirectionDown, &migrate.Opts{TargetVersion: migrate.Latest() - 3})
	require.NoError(t, err)
	require.Equal(t, []int{migrate.Latest() - 1, migrate.Latest() - 2}, res.Versions)
	require.Equal(t, migrate.Latest()-3, res.To)

	res, err = m.Migrate(ctx, migrate.DirectionDown, &migrate.Opts{MaxSteps: migrate.AllSteps})
	require.NoError(t, err)
	v, err = m.Version(ctx)
	require.NoError(t, err)
	require.Zero(t, v)
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'schema_migrations'`, schema))

	// And up again from nothing.
	res, err = m.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
	require.Len(t, res.Versions, migrate.Latest())
}

func TestPrintQuotesSchema(t *testing.T) {
	t.Parallel()
	up, err := migrate.Print("user", migrate.DirectionUp, 0, 0)
	require.NoError(t, err)
	require.Contains(t, up, `CREATE SCHEMA IF NOT EXISTS "user";`)
	require.Contains(t, up, `CREATE TABLE "user".processed_messages`)
	require.NotContains(t, up, "{{schema}}")
	down, err := migrate.Print("user", migrate.DirectionDown, migrate.Latest(), 0)
	require.NoError(t, err)
	require.True(t, strings.Contains(down, `DROP TABLE IF EXISTS "user".processed_messages`))

	// The printed SQL applies cleanly: what teams with their own tools run.
	db := pgtest.DB(t)
	schema := pgtest.NewName("printed")
	up, err = migrate.Print(schema, migrate.DirectionUp, 0, 0)
	require.NoError(t, err)
	pgtest.Exec(t, db, up)
	t.Cleanup(func() { pgtest.Exec(t, db, `DROP SCHEMA `+pgtx.QuoteIdentifier(schema)+` CASCADE`) })
	down, err = migrate.Print(schema, migrate.DirectionDown, migrate.Latest(), 0)
	require.NoError(t, err)
	pgtest.Exec(t, db, down)
}

func TestInvalidSchemaRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	for _, bad := range []string{`x"; DROP TABLE y; --`, "Upper", "1abc", strings.Repeat("a", 64), "with space"} {
		_, err := migrate.New(db, migrate.Config{Schema: bad}, nil)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "lower-case letters")
		_, err = migrate.Print(bad, migrate.DirectionUp, 0, 0)
		require.Error(t, err, bad)
	}
	_, err := migrate.New(nil, migrate.Config{}, nil)
	require.ErrorContains(t, err, "db is nil")
}

// hookLogger passes each info line of the code under test, with its fields, to onInfo.
type hookLogger struct {
	onInfo func(msg string, fields watermill.LogFields)
	fields watermill.LogFields
}

func (l hookLogger) Error(string, error, watermill.LogFields) {}
func (l hookLogger) Debug(string, watermill.LogFields)        {}
func (l hookLogger) Trace(string, watermill.LogFields)        {}
func (l hookLogger) Info(msg string, fields watermill.LogFields) {
	l.onInfo(msg, l.fields.Add(fields))
}
func (l hookLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return hookLogger{onInfo: l.onInfo, fields: l.fields.Add(fields)}
}

// versions returns from, from±1, ..., to.
func versions(from, to int) []int {
	var out []int
	for v := from; ; {
		out = append(out, v)
		if v == to {
			return out
		}
		if v < to {
			v++
		} else {
			v--
		}
	}
}

// An up and a down to version 5 started at the same moment from two processes (two pools) run
// one after the other, each its own path once, instead of undoing each other step by step until
// PostgreSQL runs out of column numbers.
func TestOpposingMigrationsRunOneAfterTheOther(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	latest := migrate.Latest()
	const downTo, start = 5, 8 // start lies between the targets: both calls have work
	require.Greater(t, latest, start)
	dbUp, dbDown := pgtest.OpenDB(t, 2), pgtest.OpenDB(t, 2)
	schema := pgtest.NewName("mig")
	t.Cleanup(func() { pgtest.Exec(t, dbUp, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(schema)+` CASCADE`) })
	up, err := migrate.New(dbUp, migrate.Config{Schema: schema}, nil)
	require.NoError(t, err)
	down, err := migrate.New(dbDown, migrate.Config{Schema: schema}, nil)
	require.NoError(t, err)
	toDownTo := &migrate.Opts{TargetVersion: downTo, MaxSteps: migrate.AllSteps}

	_, err = up.Migrate(ctx, migrate.DirectionUp, &migrate.Opts{TargetVersion: start})
	require.NoError(t, err)
	// Every step writes the version table: count the steps there, and fail a step once a round
	// takes more than both paths whole, long before a ping-pong exhausts column numbers.
	maxSteps := 2 * (latest - downTo)
	q := func(name string) string { return pgtx.QualifiedName(schema, name) }
	pgtest.Exec(t, dbUp, `CREATE TABLE `+q("test_steps")+` (n integer NOT NULL);
INSERT INTO `+q("test_steps")+` VALUES (0);
CREATE FUNCTION `+q("test_count_step")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE `+q("test_steps")+` SET n = n + 1;
    IF (SELECT n FROM `+q("test_steps")+`) > `+strconv.Itoa(maxSteps)+` THEN
        RAISE EXCEPTION 'test: more than `+strconv.Itoa(maxSteps)+` migration steps in one round: up and down undo each other';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER test_count_step AFTER INSERT OR DELETE ON `+q("schema_migrations")+`
    FOR EACH ROW EXECUTE FUNCTION `+q("test_count_step")+`()`)

	const rounds = 3
	for round := range rounds {
		if round > 0 { // back to start from where the last round ended
			_, err = up.Migrate(ctx, migrate.DirectionUp, &migrate.Opts{TargetVersion: start})
			require.NoError(t, err)
			_, err = down.Migrate(ctx, migrate.DirectionDown, &migrate.Opts{TargetVersion: start, MaxSteps: migrate.AllSteps})
			require.NoError(t, err)
		}
		pgtest.Exec(t, dbUp, `UPDATE `+q("test_steps")+` SET n = 0`)

		var upRes, downRes migrate.Result
		var upErr, downErr error
		var wg sync.WaitGroup
		begin := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-begin
			upRes, upErr = up.Migrate(ctx, migrate.DirectionUp, nil)
		}()
		go func() {
			defer wg.Done()
			<-begin
			downRes, downErr = down.Migrate(ctx, migrate.DirectionDown, toDownTo)
		}()
		close(begin)
		wg.Wait()
		require.NoError(t, upErr, "round %d", round)
		require.NoError(t, downErr, "round %d", round)

		// Whole runs, one after the other: the second starts where the first left the schema.
		final := latest
		first := migrate.DirectionDown
		if upRes.From == start {
			first = migrate.DirectionUp
			require.Equal(t, migrate.Result{Direction: migrate.DirectionUp, Versions: versions(start+1, latest), From: start, To: latest}, upRes, "round %d: up first", round)
			require.Equal(t, migrate.Result{Direction: migrate.DirectionDown, Versions: versions(latest, downTo+1), From: latest, To: downTo}, downRes, "round %d: then down", round)
			final = downTo
		} else {
			require.Equal(t, migrate.Result{Direction: migrate.DirectionDown, Versions: versions(start, downTo+1), From: start, To: downTo}, downRes, "round %d: down first", round)
			require.Equal(t, migrate.Result{Direction: migrate.DirectionUp, Versions: versions(downTo+1, latest), From: downTo, To: latest}, upRes, "round %d: then up", round)
		}
		t.Logf("round %d: %s ran first", round, first)
		require.Equal(t, len(upRes.Versions)+len(downRes.Versions), pgtest.Count(t, dbUp, `SELECT n FROM `+q("test_steps")), "round %d: steps in the version table", round)
		v, err := up.Version(ctx)
		require.NoError(t, err)
		require.Equal(t, final, v, "round %d", round)
	}

	// The schema still works: up to the latest, and the columns the reverted migrations add
	// take writes. Each round reverted 009 at most once, dropping its two columns of intents.
	pgtest.Exec(t, dbUp, `UPDATE `+q("test_steps")+` SET n = 0`)
	_, err = up.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
	pgtest.Exec(t, dbUp, `INSERT INTO `+q("intents")+` (channel, intent_key, consumer, event_id, step, payload, trace_parent)
VALUES ('mail', 'k-1', 'c', 'e-1', 's', '\x00', '00-trace')`)
	pgtest.Exec(t, dbUp, `INSERT INTO `+q("outbox_offsets")+` (consumer_group, last_processed_transaction_id, idle_until)
VALUES ('relay', pg_current_xact_id(), now())`)
	require.Equal(t, 1, pgtest.Count(t, dbUp, `SELECT count(*) FROM `+q("intents")+` WHERE trace_parent = '00-trace'`))
	require.Equal(t, 1, pgtest.Count(t, dbUp, `SELECT count(*) FROM `+q("outbox_offsets")+` WHERE idle_until IS NOT NULL`))
	require.LessOrEqual(t, pgtest.Count(t, dbUp, `SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass AND attisdropped`, q("intents")), 2*rounds)
}

// A Migrate call waits for another process's migration of the schema, saying so, and does not
// run meanwhile; a caller that stops waiting gets an error naming the lock. Once the lock is
// free, the call plans from the version it then finds.
func TestMigrateWaitsForTheLockOfAnotherMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	latest := migrate.Latest()
	key := worker.LockKey("migrate", schema)

	// Another process's migration is under way: its connection holds the schema's lock.
	other, err := pgtest.OpenDB(t, 1).Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	var otherPID int
	require.NoError(t, other.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&otherPID))
	_, err = other.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key)
	require.NoError(t, err)

	waiting := make(chan watermill.LogFields, 2)
	m, err := migrate.New(db, migrate.Config{Schema: schema}, hookLogger{onInfo: func(msg string, fields watermill.LogFields) {
		if strings.HasPrefix(msg, "Waiting for another migration") {
			waiting <- fields
		}
	}})
	require.NoError(t, err)

	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := m.Migrate(waitCtx, migrate.DirectionDown, nil)
		errc <- err
	}()
	fields := testwait.Receive(t, waiting, "Migrate to log that it waits for the lock")
	require.Equal(t, key, fields["lock_key"])
	require.Equal(t, otherPID, fields["holder_pid"])
	v, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, latest, v, "the down waits; it does not run while the other migration holds the lock")
	cancel()
	err = testwait.Receive(t, errc, "Migrate to give up waiting when its context ends")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorContains(t, err, fmt.Sprintf("migrate: wait for the migration lock of schema %q (advisory lock %d), held by another migration", schema, key))

	resc := make(chan migrate.Result, 1)
	go func() {
		res, err := m.Migrate(ctx, migrate.DirectionDown, nil)
		assert.NoError(t, err)
		resc <- res
	}()
	testwait.Receive(t, waiting, "the second down to wait for the lock")
	// The other process reverts the latest migration and lets go of the lock.
	sql, err := migrate.Print(schema, migrate.DirectionDown, latest, latest-1)
	require.NoError(t, err)
	_, err = other.ExecContext(ctx, sql+`; DELETE FROM `+pgtx.QualifiedName(schema, "schema_migrations")+` WHERE version = `+strconv.Itoa(latest))
	require.NoError(t, err)
	_, err = other.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, key)
	require.NoError(t, err)
	res := testwait.Receive(t, resc, "the second down to run once the lock is free")
	require.Equal(t, migrate.Result{Direction: migrate.DirectionDown, Versions: []int{latest - 1}, From: latest - 1, To: latest - 2}, res,
		"planned from the version found under the lock")

	classid, objid := worker.LockKeyParts(key)
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 1`, classid, objid),
		"no connection keeps the lock after Migrate returns")
	_, err = m.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
}

// A run stops, saying why, when the version table changes under its lock: something applied a
// migration without taking the lock. The next run starts from what it then finds.
func TestMigrateStopsWhenTheVersionMovesUnderIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.DB(t)
	byHand := pgtest.OpenDB(t, 1)
	schema := pgtest.NewName("mig")
	t.Cleanup(func() { pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(schema)+` CASCADE`) })
	third, err := migrate.Print(schema, migrate.DirectionUp, 2, 3)
	require.NoError(t, err)

	m, err := migrate.New(db, migrate.Config{Schema: schema}, hookLogger{onInfo: func(msg string, fields watermill.LogFields) {
		// Right after 002 commits, someone applies 003 by hand, without the lock.
		if fields["version"] == 2 {
			pgtest.Exec(t, byHand, third) // the printed SQL records version 3 itself
		}
	}})
	require.NoError(t, err)
	res, err := m.Migrate(ctx, migrate.DirectionUp, nil)
	require.ErrorContains(t, err, fmt.Sprintf("migrate: schema %q went from version 2 to 3 while this migration held the migration lock", schema))
	require.ErrorContains(t, err, "stopped before up 003_idempotency")
	require.Equal(t, migrate.Result{Direction: migrate.DirectionUp, Versions: []int{1, 2}, From: 0, To: 2}, res)

	m, err = migrate.New(db, migrate.Config{Schema: schema}, nil)
	require.NoError(t, err)
	res, err = m.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
	require.Equal(t, versions(4, migrate.Latest()), res.Versions)
}

// An applied migration that differs from the binary's stops Migrate before anything runs, in
// either direction; a version recorded without a checksum (an older binary's version table, or
// SQL from Print) gets this binary's, and clearing a checksum lets the next call record it.
func TestMigrateRefusesAChangedAppliedMigration(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.NewName("mig_sum")
	t.Cleanup(func() { pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(schema)+` CASCADE`) })
	ctx := context.Background()
	m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
	require.NoError(t, err)
	_, err = m.Migrate(ctx, migrate.DirectionUp, &migrate.Opts{TargetVersion: 3})
	require.NoError(t, err)
	all, err := migrate.All()
	require.NoError(t, err)
	versions := pgtx.QualifiedName(schema, "schema_migrations")
	checksum := func(v int) string {
		var s sql.NullString
		require.NoError(t, db.QueryRow(`SELECT checksum FROM `+versions+` WHERE version = $1`, v).Scan(&s))
		return s.String
	}
	require.Equal(t, all[1].Checksum(), checksum(2), "Migrate records each migration's checksum")

	// As an older binary left it: no checksum column.
	pgtest.Exec(t, db, `ALTER TABLE `+versions+` DROP COLUMN checksum`)
	res, err := m.Migrate(ctx, migrate.DirectionUp, &migrate.Opts{TargetVersion: 4})
	require.NoError(t, err)
	require.Equal(t, []int{4}, res.Versions)
	for v := 1; v <= 4; v++ {
		require.Equal(t, all[v-1].Checksum(), checksum(v), "version %d", v)
	}

	// Migration 002 as applied is not this binary's 002.
	pgtest.Exec(t, db, `UPDATE `+versions+` SET checksum = 'edited' WHERE version = 2`)
	for _, dir := range []migrate.Direction{migrate.DirectionUp, migrate.DirectionDown} {
		res, err = m.Migrate(ctx, dir, nil)
		require.ErrorIs(t, err, migrate.ErrChangedMigration, dir)
		require.ErrorContains(t, err, "002_inbox was applied with sha256 edited")
		require.Empty(t, res.Versions, dir)
	}
	version, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, version)

	pgtest.Exec(t, db, `UPDATE `+versions+` SET checksum = NULL WHERE version = 2`)
	_, err = m.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
	require.Equal(t, all[1].Checksum(), checksum(2))
}

// Printed SQL keeps the version table as Migrate does (issue 34, item 8): applied by hand, it
// leaves a schema Migrate finds at the version printed, with every checksum, and the printed
// down SQL takes the rows away again.
func TestPrintedSQLRecordsItsVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.DB(t)
	schema := pgtest.NewName("printed_v")
	t.Cleanup(func() { pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(schema)+` CASCADE`) })
	all, err := migrate.All()
	require.NoError(t, err)
	latest := migrate.Latest()

	up, err := migrate.Print(schema, migrate.DirectionUp, 0, 5)
	require.NoError(t, err)
	pgtest.Exec(t, db, up)
	m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
	require.NoError(t, err)
	state, err := m.State(ctx)
	require.NoError(t, err)
	require.Equal(t, migrate.State{Version: 5}, state)
	var recorded int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+pgtx.QualifiedName(schema, "schema_migrations")+` WHERE checksum = ANY($1)`,
		[]string{all[0].Checksum(), all[1].Checksum(), all[2].Checksum(), all[3].Checksum(), all[4].Checksum()}).Scan(&recorded))
	require.Equal(t, 5, recorded, "each printed migration records its checksum")

	// The rest, printed from 5, on a version table as an earlier Migrate left it (no checksum
	// column): the printed SQL adds the column; then Migrate has nothing to do.
	pgtest.Exec(t, db, `ALTER TABLE `+pgtx.QualifiedName(schema, "schema_migrations")+` DROP COLUMN checksum`)
	rest, err := migrate.Print(schema, migrate.DirectionUp, 5, 0)
	require.NoError(t, err)
	pgtest.Exec(t, db, rest)
	res, err := m.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
	require.Equal(t, migrate.Result{Direction: migrate.DirectionUp, From: latest, To: latest}, res)

	down, err := migrate.Print(schema, migrate.DirectionDown, latest, 3)
	require.NoError(t, err)
	pgtest.Exec(t, db, down)
	v, err := m.Version(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, v)
	res, err = m.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
	require.Equal(t, versions(4, latest), res.Versions, "Migrate goes on from where the printed down SQL left")
}

// A schema built from an earlier release's printed SQL has the tables and no version rows:
// Migrate up refuses it, saying how to record it, instead of failing on "already exists";
// Baseline records what it holds, and Migrate applies the rest.
func TestBaselineRecordsASchemaBuiltWithoutVersionRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.DB(t)
	schema := pgtest.NewName("unrecorded")
	t.Cleanup(func() { pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(schema)+` CASCADE`) })
	up, err := migrate.Print(schema, migrate.DirectionUp, 0, 10)
	require.NoError(t, err)
	pgtest.Exec(t, db, up+`; DROP TABLE `+pgtx.QualifiedName(schema, "schema_migrations"))
	m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
	require.NoError(t, err)
	state, err := m.State(ctx)
	require.NoError(t, err)
	require.Equal(t, migrate.State{Unrecorded: true}, state)

	res, err := m.Migrate(ctx, migrate.DirectionUp, nil)
	require.ErrorIs(t, err, migrate.ErrUnrecordedSchema)
	require.ErrorContains(t, err, fmt.Sprintf("wmonce -schema %s migrate baseline N", schema))
	require.Empty(t, res.Versions)

	require.ErrorContains(t, m.Baseline(ctx, 0), "between 1 and")
	require.NoError(t, m.Baseline(ctx, 10))
	require.ErrorContains(t, m.Baseline(ctx, 10), "records migrations up to 10 already")
	res, err = m.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
	require.Equal(t, versions(11, migrate.Latest()), res.Versions)

	empty, err := migrate.New(db, migrate.Config{Schema: pgtest.NewName("empty")}, nil)
	require.NoError(t, err)
	require.ErrorContains(t, empty.Baseline(ctx, 3), "has no watermill-once tables")
}

// A version row deleted below the highest is noticed (issue 34, item 8): State lists it,
// Migrate refuses to run in either direction and says how to record it again.
func TestMigrateRefusesAVersionTableWithAGap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
	require.NoError(t, err)
	table := pgtx.QualifiedName(schema, "schema_migrations")
	pgtest.Exec(t, db, `DELETE FROM `+table+` WHERE version IN (5, 7)`)

	state, err := m.State(ctx)
	require.NoError(t, err)
	require.Equal(t, migrate.State{Version: migrate.Latest(), Missing: []int{5, 7}}, state)
	var advice string
	for _, dir := range []migrate.Direction{migrate.DirectionUp, migrate.DirectionDown} {
		res, err := m.Migrate(ctx, dir, nil)
		require.ErrorIs(t, err, migrate.ErrMissingVersion, dir)
		require.ErrorContains(t, err, "no row for 005_retention, 007_inbox_attempts")
		require.Empty(t, res.Versions)
		advice = err.Error()
	}
	// The statement the error gives, as an operator would paste it.
	_, stmt, ok := strings.Cut(advice, "record them (the next migrate fills in the checksums): ")
	require.True(t, ok, advice)
	stmt, _, ok = strings.Cut(stmt, "; otherwise")
	require.True(t, ok, advice)
	pgtest.Exec(t, db, stmt)
	res, err := m.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
	require.Empty(t, res.Versions)
	all, err := migrate.All()
	require.NoError(t, err)
	var checksum string
	require.NoError(t, db.QueryRow(`SELECT checksum FROM `+table+` WHERE version = 5`).Scan(&checksum))
	require.Equal(t, all[4].Checksum(), checksum)
}
