package migrate_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
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
