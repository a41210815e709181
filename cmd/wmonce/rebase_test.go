package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// After a restore into a cluster whose transaction counter is lower (simulated: relay sms's
// position moved far ahead of this cluster's counter, as pg_restore leaves it), status and
// doctor report it with what to run, rebase repairs it, and both are clean after.
func TestStatusDoctorAndRebaseOfARestoredSchema(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	pgtest.Exec(t, f.db, `UPDATE `+f.table("outbox_offsets")+` SET snapshot =
    ((pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 10000000)::text || ':' || (pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 10000000)::text || ':')::pg_snapshot,
    system_identifier = 4242`)

	r := runCLI(t, f.schema, "status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `RESTORED: position "sms" was recorded on another cluster (its snapshot is ahead of this cluster's transaction counter; 1 rows written since look older than it`)
	require.Contains(t, r.stdout, "wmonce -schema "+f.schema+" rebase")
	var st statusReport
	r = runCLI(t, f.schema, "-json", "status")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.True(t, st.Outbox.Relays[0].Moved)

	r = runCLI(t, f.schema, "doctor")
	require.Equal(t, exitFailure, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "RESTORED: schema "+f.schema+`, position "sms"`)
	require.Contains(t, r.stderr, "recorded on another cluster")

	r = runCLI(t, f.schema, "rebase", "-dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `RESTORED: position "sms"`)
	require.Contains(t, r.stdout, "dry run")
	require.Equal(t, exitFailure, runCLI(t, f.schema, "doctor").code, "a dry run changes nothing")

	r = runCLI(t, f.schema, "rebase")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "rebased sms: 1 outbox row(s) will be forwarded again")

	r = runCLI(t, f.schema, "status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.NotContains(t, r.stdout, "RESTORED")
	require.Regexp(t, `(?m)^\s+sms\s+1\s+\d{4}-`, r.stdout, "the row the relay had not forwarded still waits")
	r = runCLI(t, f.schema, "doctor")
	require.Equal(t, exitOK, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "ok: outbox positions of schema "+f.schema+" (1) were recorded on this cluster")

	r = runCLI(t, f.schema, "rebase")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "nothing to rebase")

	r = wmonceRaw(t, "help", "rebase")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "wmonce rebase [-broker-schema NAME] [-dry-run]")
}

// -broker-schema: status and doctor report a SQL broker topic table restored into a cluster with
// a lower counter (simulated: its rows' ids moved far ahead), rebase repairs it, and both are
// clean after; a schema with no moved table is left alone.
func TestRebaseBrokerSchema(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	bs := f.schema + "_b"
	t.Cleanup(func() { pgtest.Exec(t, f.db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(bs)+` CASCADE`) })
	cfg := broker.Config{Kind: broker.SQL, SQL: broker.SQLConfig{Schema: bs}, Subscriptions: []broker.Subscription{{Topic: "t", Group: "g"}}}
	b, err := broker.New(ctx, f.db, cfg, nil)
	require.NoError(t, err)
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", message.NewMessage("m-1", []byte("x")), message.NewMessage("m-2", []byte("x"))))
	require.NoError(t, pub.Close())
	require.NoError(t, b.Close())

	r := runCLI(t, f.schema, "doctor", "-broker-schema", bs)
	require.Equal(t, exitOK, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "ok: the SQL broker's topic tables of schema "+bs+" (1) were written on this cluster")

	pgtest.Exec(t, f.db, `UPDATE `+pgtx.QualifiedName(bs, "watermill_t")+` SET transaction_id = (transaction_id::text::bigint + 1099511627776)::text::xid8`)
	r = runCLI(t, f.schema, "status", "-broker-schema", bs)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "RESTORED: SQL broker schema "+bs+", topic t: 2 row(s) and groups [none] are ahead")
	require.Contains(t, r.stdout, "wmonce -schema "+f.schema+" rebase -broker-schema "+bs)
	r = runCLI(t, f.schema, "doctor", "-broker-schema", bs)
	require.Equal(t, exitFailure, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "RESTORED: SQL broker schema "+bs)

	r = runCLI(t, f.schema, "rebase", "-dry-run", "-broker-schema", bs)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "topic t: 2 row(s) ahead; groups ahead: ")
	r = runCLI(t, f.schema, "rebase", "-broker-schema", bs)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "topic t: 2 row(s) to be read again")
	r = runCLI(t, f.schema, "doctor", "-broker-schema", bs)
	require.Equal(t, exitOK, r.code, r.stdout+r.stderr)
	r = runCLI(t, f.schema, "rebase", "-broker-schema", bs)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "SQL broker: schema "+bs+": no topic table to rebase")

	r = runCLI(t, f.schema, "rebase", "-broker-schema", "bad schema")
	require.Equal(t, exitUsage, r.code, r.stdout)
	r = runCLI(t, f.schema, "doctor", "-broker-schema", "bad schema")
	require.Equal(t, exitUsage, r.code, r.stdout)
}
