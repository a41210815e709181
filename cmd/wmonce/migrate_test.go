package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// A schema built from `wmonce migrate print`, applied by hand as the docs offer teams with
// their own migration tool, is a schema like any other to every command (issue 34, item 8):
// the printed SQL records its versions, so nothing says "version 0" and migrate up has nothing
// to do. The same SQL without its version rows (an earlier release's) gets advice that works.
func TestPrintedSchemaWorksWithEveryCommand(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.NewName("printed_cli")
	t.Cleanup(func() { pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(schema)+` CASCADE`) })
	latest := migrate.Latest()

	r := runCLI(t, schema, "migrate", "print")
	require.Equal(t, exitOK, r.code, r.stderr)
	pgtest.Exec(t, db, r.stdout) // one multi-statement script in one transaction, as psql -1 runs it
	fillPrinted(t, db, schema)

	for _, args := range [][]string{
		{"status"}, {"failures"}, {"outbox"}, {"inbox", "stats"}, {"pause", "-relay", "sms"}, {"resume", "-relay", "sms"},
	} {
		r := runCLI(t, schema, args...)
		require.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
		require.NotContains(t, r.stdout+r.stderr, "version 0", args)
		require.NotContains(t, r.stderr, "warning", args)
	}
	r = runCLI(t, schema, "-json", "migrate", "version")
	require.Equal(t, exitOK, r.code, r.stderr)
	var v operate.SchemaStatus
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.Equal(t, operate.SchemaStatus{Schema: schema, Version: latest, Latest: latest}, v)
	r = runCLI(t, schema, "migrate", "up")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("nothing to do, at version %d", latest))

	h, err := admin.NewHandler(db, admin.Config{Schema: schema, SampleInterval: -1}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/api/status")
	require.NoError(t, err)
	defer resp.Body.Close()
	var st operate.StatusResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	require.Equal(t, operate.SchemaStatus{Schema: schema, Version: latest, Latest: latest}, st.SchemaStatus, "/api/status")

	// As an earlier release printed it: the tables, no version table. Every command names the
	// one command that records it, and that command works.
	old := pgtest.NewName("printed_old")
	t.Cleanup(func() { pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(old)+` CASCADE`) })
	printed, err := migrate.Print(old, migrate.DirectionUp, 0, 0)
	require.NoError(t, err)
	pgtest.Exec(t, db, printed+`; DROP TABLE `+pgtx.QualifiedName(old, "schema_migrations"))
	advice := fmt.Sprintf("record the migrations that SQL held with `wmonce -schema %s migrate baseline N`", old)
	for _, args := range [][]string{{"status"}, {"failures"}, {"migrate", "up"}} {
		r := runCLI(t, old, args...)
		require.Equal(t, exitFailure, r.code, "%v: %s", args, r.stdout)
		require.Contains(t, r.stderr, advice, args)
		require.NotContains(t, r.stderr, "already exists", args)
	}
	r = runCLI(t, old, "migrate", "version")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, advice)
	r = runCLI(t, old, "migrate", "baseline", fmt.Sprint(latest))
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("recorded migrations 1 to %d", latest))
	r = runCLI(t, old, "migrate", "up")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "nothing to do")
	r = runCLI(t, old, "status")
	require.Equal(t, exitOK, r.code, r.stderr)

	r = runCLI(t, old, "migrate", "baseline", "0")
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, fmt.Sprintf("the version must be between 1 and %d", latest))
}

// A version row deleted below the highest is reported by `migrate version` and refused by
// `migrate up`, each with the statement that records it again.
func TestMigrateVersionReportsAMissingRow(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pgtest.Exec(t, db, `DELETE FROM `+pgtx.QualifiedName(schema, "schema_migrations")+` WHERE version = 4`)
	insert := fmt.Sprintf("INSERT INTO %s (version, name) VALUES (4, 'operations')", pgtx.QualifiedName(schema, "schema_migrations"))

	r := runCLI(t, schema, "migrate", "version")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "has no row for 004_operations")
	require.Contains(t, r.stdout, insert)
	r = runCLI(t, schema, "-json", "migrate", "version")
	var v operate.SchemaStatus
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.Equal(t, []int{4}, v.Missing)

	r = runCLI(t, schema, "migrate", "up")
	require.Equal(t, exitFailure, r.code, r.stdout)
	require.Contains(t, r.stderr, insert)
	r = runCLI(t, schema, "status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "warning: schema "+schema+" is at version")
}

// fillPrinted runs the real components on a printed schema: a claim with an outbox row that
// relay "sms" forwards, which registers the relay the pause commands name.
func fillPrinted(t *testing.T, db *sql.DB, schema string) {
	t.Helper()
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "rewards", OutputTopic: "cashback"}, nil)
	require.NoError(t, err)
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{}`))}, nil
	})
	_, err = h(message.NewMessage("m-1", []byte(`1`)))
	require.NoError(t, err)
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema, Name: "sms", BatchSize: 10}, nil)
	require.NoError(t, err)
	relayUntil(t, relay, "forward the row", func(c outbox.RelayCounters) bool { return c.Forwarded >= 1 })
}
