package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

func TestHelpAndUsageErrors(t *testing.T) {
	t.Parallel()
	r := wmonceRaw(t, "help")
	require.Equal(t, exitOK, r.code)
	for _, c := range []string{"migrate", "status", "inbox", "outbox", "dedupe", "purge", "admin", "rebase", "DATABASE_URL", "Exit codes"} {
		require.Contains(t, r.stdout, c)
	}
	r = wmonceRaw(t, "help", "inbox")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "wmonce inbox replay -consumer C")
	require.Contains(t, r.stdout, "Examples:")
	r = wmonceRaw(t, "purge", "-h")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, "-older-than")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage:"},
		{[]string{"stauts"}, `did you mean "status"`},
		{[]string{"-nope", "status"}, "flag provided but not defined"},
		{[]string{"-schema", "Bad-Name", "status"}, "-schema: schema name \"Bad-Name\" is not allowed"},
		{[]string{"inbox", "list"}, "-consumer is required"},
		{[]string{"inbox", "lst"}, `did you mean "list"`},
		{[]string{"inbox", "list", "-consumer", "c", "-status", "LOST"}, `unknown inbox status "LOST"`},
		{[]string{"inbox", "replay", "-consumer", "c", "-status", "IN_PROGRESS"}, "belong to a worker"},
		// The inbox's rule (operate.CheckChange), checked before the database is opened.
		{[]string{"inbox", "skip", "-consumer", "c", "-key", "k", "-reason", "r", "-status", "DONE"}, "status DONE cannot be changed by skip (allowed: FAILED, PENDING)"},
		{[]string{"inbox", "skip", "-consumer", "c", "-key", "k"}, "-reason is required"},
		{[]string{"inbox", "skip", "-consumer", "c", "-reason", "r"}, "name the rows to skip"},
		{[]string{"inbox", "unpark", "-consumer", "c"}, "-key is required"},
		{[]string{"inbox", "inspect"}, "give a row id, or -consumer and -message"},
		{[]string{"inbox", "inspect", "x"}, "positive integer"},
		{[]string{"dedupe", "-consumer", "c"}, "give both -consumer and -message"},
		{[]string{"migrate"}, "up, down, print, baseline or version"},
		{[]string{"migrate", "down", "-steps", "2", "-all"}, "only one of"},
		{[]string{"migrate", "print", "-from", "3", "-to", "2"}, "nothing to print"},
		{[]string{"purge", "-older-than", "30d"}, "-consumer, or give -all"},
		{[]string{"purge", "-consumer", "c"}, "exactly one of -before DATE and -older-than AGE"},
		{[]string{"purge", "-consumer", "c", "-older-than", "soon"}, "not an age"},
		{[]string{"purge", "-consumer", "c", "-before", "next week"}, "neither a date"},
		{[]string{"purge", "-janitor"}, "needs -keep"},
		{[]string{"purge", "-janitor", "-keep", "7d", "-consumer", "c"}, "-janitor runs the janitor's own windows"},
		{[]string{"purge", "-consumer", "c", "-older-than", "30d", "-cdc-slots", "s"}, "-cdc-slots belong to -janitor"},
		{[]string{"status", "extra"}, `unexpected argument "extra"`},
		// Text PostgreSQL cannot hold, and consumer names no component accepts: the API's rules.
		{[]string{"inbox", "list", "-consumer", "c\x00"}, "-consumer must not contain NUL"},
		{[]string{"inbox", "list", "-consumer", "c\xff"}, "-consumer must be valid UTF-8"},
		{[]string{"inbox", "list", "-consumer", strings.Repeat("c", 256)}, "-consumer is 256 bytes long; the limit is 255"},
		{[]string{"inbox", "list", "-consumer", "c", "-key", "k\x00"}, "-key must not contain NUL"},
		{[]string{"inbox", "list", "-consumer", "c", "-message", "ok", "-message", "\xff"}, "-message must be valid UTF-8"},
		{[]string{"inbox", "list", "-consumer", "c", "-topic", "t\x00"}, "-topic must not contain NUL"},
		{[]string{"inbox", "list", "-consumer", "c", "-error", "\xfe"}, "-error must be valid UTF-8"},
		{[]string{"inbox", "replay", "-consumer", "c\x00"}, "-consumer must not contain NUL"},
		{[]string{"inbox", "skip", "-consumer", "c", "-all", "-reason", "r\x00"}, "-reason must not contain NUL"},
		{[]string{"inbox", "skip", "-consumer", "c", "-all", "-reason", "bad \xff reason"}, "-reason must be valid UTF-8"},
		{[]string{"inbox", "skip", "-consumer", "adm\xff", "-all", "-reason", "r"}, "-consumer must be valid UTF-8"},
		{[]string{"inbox", "replay", "-consumer", "c", "-message", "\xed\xa0\x80"}, "-message must be valid UTF-8"}, // a surrogate as UTF-8
		{[]string{"inbox", "unpark", "-consumer", "c", "-key", "\xff"}, "-key must be valid UTF-8"},
		{[]string{"inbox", "inspect", "-consumer", "c\x00", "-message", "m"}, "-consumer must not contain NUL"},
		{[]string{"inbox", "inspect", "-consumer", "c", "-message", "m\xff"}, "-message must be valid UTF-8"},
		{[]string{"dedupe", "-consumer", strings.Repeat("c", 300), "-message", "m"}, "-consumer is 300 bytes long"},
		{[]string{"dedupe", "-consumer", "c", "-message", "m\x00"}, "-message must not contain NUL"},
		{[]string{"dedupe", "-consumer", "adm\xff", "-message", "m"}, "-consumer must be valid UTF-8"},
		{[]string{"purge", "-consumer", "c\xff", "-older-than", "30d"}, "-consumer must be valid UTF-8"},
		{[]string{"purge", "-consumer", "c\x00", "-older-than", "30d"}, "-consumer must not contain NUL"},
		{[]string{"purge", "-consumer", strings.Repeat("c", 256), "-older-than", "30d"}, "-consumer is 256 bytes long"},
	} {
		r := wmonceRaw(t, tc.args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, "%v", tc.args)
		require.Empty(t, r.stdout, "%v", tc.args)
	}
}

func TestMigratePrintNeedsNoDatabase(t *testing.T) {
	t.Parallel()
	latest := migrate.Latest()
	r := wmonceRaw(t, "-database-url", "postgres://nobody@127.0.0.1:1/none", "-schema", "billing_app", "migrate", "print")
	require.Equal(t, exitOK, r.code, r.stderr)
	want, err := migrate.Print("billing_app", migrate.DirectionUp, 0, latest)
	require.NoError(t, err)
	require.Equal(t, want, r.stdout)
	require.Contains(t, r.stdout, `CREATE TABLE "billing_app".processed_messages`)

	r = wmonceRaw(t, "migrate", "print", "-down", "-from", strconv.Itoa(latest), "-to", strconv.Itoa(latest-1))
	require.Equal(t, exitOK, r.code, r.stderr)
	want, err = migrate.Print(pgtx.DefaultSchema, migrate.DirectionDown, latest, latest-1)
	require.NoError(t, err)
	require.Equal(t, want, r.stdout)
}

func TestUnreachableOrUnparsableDatabaseSaysWhatToFix(t *testing.T) {
	t.Parallel()
	r := wmonceRaw(t, "-database-url", "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", "status")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "cannot reach PostgreSQL at 127.0.0.1:1/test")
	require.Contains(t, r.stderr, "fix: start PostgreSQL there, or point -database-url (or DATABASE_URL) at a running server")

	r = wmonceRaw(t, "-database-url", "postgres://%zz", "outbox")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "cannot parse the database URL")
	require.Contains(t, r.stderr, "postgres://user:password@host:5432/dbname")

	pgtest.SkipShort(t) // the last case needs a server that answers
	r = wmonceRaw(t, "-database-url", pgtest.URL()+"&dbname=wmonce_no_such_db", "status")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "create the database")
}

func TestMigrateUpDownVersion(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.NewName("cli")
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA IF EXISTS ` + pgtx.QuoteIdentifier(schema) + ` CASCADE`) })
	latest := migrate.Latest()

	r := runCLI(t, schema, "status")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, fmt.Sprintf("schema %s is at version 0 (no watermill-once tables): run `wmonce -schema %s migrate up`", schema, schema))

	r = runCLI(t, schema, "migrate", "up", "-to", "2")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "applied 001_core, 002_inbox; version 0 -> 2")

	// Behind: commands warn and still work on the tables that exist.
	r = runCLI(t, schema, "inbox", "stats")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, fmt.Sprintf("warning: schema %s is at version 2, this binary knows %d", schema, latest))
	require.Contains(t, r.stdout, "the inbox is empty")

	r = runCLI(t, schema, "migrate", "up")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("version 2 -> %d", latest))
	r = runCLI(t, schema, "migrate", "up")
	require.Contains(t, r.stdout, "nothing to do")

	r = runCLI(t, schema, "-json", "migrate", "version")
	require.Equal(t, exitOK, r.code, r.stderr)
	var v operate.SchemaStatus
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.Equal(t, operate.SchemaStatus{Schema: schema, Version: latest, Latest: latest}, v)

	r = runCLI(t, schema, "migrate", "down")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("version %d -> %d", latest, latest-1), "a bare down reverts one step")
	r = runCLI(t, schema, "migrate", "down", "-to", "1")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("version %d -> 1", latest-1))
	r = runCLI(t, schema, "migrate", "down", "-all")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "reverted 001_core; version 1 -> 0")
	require.Equal(t, 0, pgtest.Count(t, db, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'schema_migrations'`, schema))
}

// `migrate up` racing `migrate down -all` (two processes: each run opens a pool of its own) take
// turns: each runs its whole path once, from where the other left the schema, and reports the
// versions it found and left under the lock.
func TestMigrateUpRacingDownAll(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.NewName("cli")
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA IF EXISTS ` + pgtx.QuoteIdentifier(schema) + ` CASCADE`) })
	latest := migrate.Latest()
	const start = 5
	r := runCLI(t, schema, "migrate", "up", "-to", strconv.Itoa(start))
	require.Equal(t, exitOK, r.code, r.stderr)

	var up, down result
	var wg sync.WaitGroup
	begin := make(chan struct{})
	wg.Add(2)
	go func() { defer wg.Done(); <-begin; up = runCLI(t, schema, "migrate", "up") }()
	go func() { defer wg.Done(); <-begin; down = runCLI(t, schema, "migrate", "down", "-all") }()
	close(begin)
	wg.Wait()
	require.Equal(t, exitOK, up.code, up.stderr)
	require.Equal(t, exitOK, down.code, down.stderr)
	if strings.Contains(up.stdout, fmt.Sprintf("version %d -> %d", start, latest)) {
		require.Contains(t, down.stdout, fmt.Sprintf("; version %d -> 0", latest), "up ran first, then down reverted everything")
	} else {
		require.Contains(t, down.stdout, fmt.Sprintf("; version %d -> 0", start), "down ran first")
		require.Contains(t, up.stdout, fmt.Sprintf("; version 0 -> %d", latest), "then up applied everything")
	}

	r = runCLI(t, schema, "migrate", "up")
	require.Equal(t, exitOK, r.code, r.stderr)
	r = runCLI(t, schema, "inbox", "stats")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "the inbox is empty")
}

func TestStatusOutboxAndDedupe(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	r := runCLI(t, f.schema, "status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^\s+rewards\s+4\s+\d{4}-\d\d-\d\d `, r.stdout, "4 claims (m-1 counted once)")
	require.Regexp(t, `(?m)^\s+billing\s+1\s+0\s+0\s+3\s+1\s+0\s+\S+`, r.stdout, "pending, retrying, in progress, failed, done, skipped")
	require.Contains(t, r.stdout, "3 FAILED row(s) of billing are parked")
	require.Regexp(t, `(?m)^\s+sms\s+1\s+\d{4}-`, r.stdout, "relay sms has one row waiting")
	require.Contains(t, r.stdout, "rejected rows: 0")

	r = runCLI(t, f.schema, "status", "-json")
	require.Equal(t, exitOK, r.code, r.stderr)
	var st statusReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Len(t, st.Consumers, 1)
	require.Equal(t, "rewards", st.Consumers[0].Consumer)
	require.Equal(t, int64(4), st.Consumers[0].Claims)
	require.NotNil(t, st.Consumers[0].NewestClaim)
	require.WithinDuration(t, time.Now(), *st.Consumers[0].NewestClaim, time.Minute)
	require.Len(t, st.Inbox, 1)
	require.Equal(t, operate.InboxStats{Consumer: "billing", Pending: 1, Failed: 3, Done: 1,
		OldestPendingReceivedAt: st.Inbox[0].OldestPendingReceivedAt, OldestPendingAgeSeconds: st.Inbox[0].OldestPendingAgeSeconds}, st.Inbox[0])
	require.Len(t, st.Outbox.Relays, 1)
	require.Equal(t, "sms", st.Outbox.Relays[0].Name)
	require.Equal(t, int64(1), st.Outbox.Relays[0].Backlog)
	require.Empty(t, st.Errors)

	r = runCLI(t, f.schema, "-json", "outbox")
	require.Equal(t, exitOK, r.code, r.stderr)
	var ob operate.OutboxStats
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &ob))
	require.Equal(t, int64(1), ob.Relays[0].Backlog)
	require.Greater(t, ob.Relays[0].LagSeconds, 0.0)

	// A claim of the middleware.
	r = runCLI(t, f.schema, "dedupe", "-consumer", "rewards", "-message", "m-2")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `processed: message "m-2" was applied by consumer "rewards" at `)
	require.Contains(t, r.stdout, "claim payload sha256 6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b") // sha256("1")
	// The same key under another consumer was never applied there.
	r = runCLI(t, f.schema, "dedupe", "-consumer", "billing", "-message", "m-2")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `not processed: no record of message "m-2" for consumer "billing"`)
	// Inbox rows: DONE is processed, FAILED is not.
	r = runCLI(t, f.schema, "-json", "dedupe", "-consumer", "billing", "-message", "inv-2")
	require.Equal(t, exitOK, r.code, r.stderr)
	var p operate.Processed
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &p))
	require.True(t, p.Processed)
	require.Nil(t, p.Claim)
	require.Equal(t, "DONE", p.Inbox.Status)
	require.NotNil(t, p.Inbox.FinishedAt)
	r = runCLI(t, f.schema, "dedupe", "-consumer", "billing", "-message", "inv-1")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `not processed: message "inv-1" is in the inbox of consumer "billing" but not applied`)
	require.Contains(t, r.stdout, "FAILED, 1 attempt(s)")
	require.Contains(t, r.stdout, "last error: card declined")
}

func TestInboxCommands(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	r := runCLI(t, f.schema, "inbox")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^\s+billing\s+1\s+0\s+0\s+3\s+1\s+0`, r.stdout)

	r = runCLI(t, f.schema, "inbox", "list", "-consumer", "billing", "-status", "FAILED")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Equal(t, []string{"inv-1", "inv-3", "inv-5"}, regexp.MustCompile(`inv-\d`).FindAllString(r.stdout, -1))
	require.Contains(t, r.stdout, "card declined")
	r = runCLI(t, f.schema, "inbox", "list", "-consumer", "billing", "-limit", "2")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("add -after %d", f.rowID(t, "inv-2")))
	r = runCLI(t, f.schema, "-json", "inbox", "list", "-consumer", "billing", "-key", "order-7")
	require.Equal(t, exitOK, r.code, r.stderr)
	var rows []operate.InboxRow
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows))
	require.Len(t, rows, 2)
	require.Equal(t, "FAILED", rows[0].Status)
	require.Equal(t, "PENDING", rows[1].Status)

	id := f.rowID(t, "inv-3")
	r = runCLI(t, f.schema, "inbox", "inspect", strconv.FormatInt(id, 10), "-json")
	require.Equal(t, exitOK, r.code, r.stderr)
	var row operate.InboxRow
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &row))
	require.Equal(t, `{"invoice":"inv-3"}`, *row.Payload)
	require.Equal(t, map[string]string{"key": "order-7", "fail": "1"}, row.Metadata)
	require.Equal(t, "order-7", row.OrderingKey)
	r = runCLI(t, f.schema, "inbox", "inspect", "-consumer", "billing", "-message", "inv-3")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `{"invoice":"inv-3"}`)
	require.Regexp(t, `(?m)^last error\s+card declined`, r.stdout)
	r = runCLI(t, f.schema, "inbox", "inspect", "999999")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "row not found")

	// Replay: a dry run counts and changes nothing.
	r = runCLI(t, f.schema, "inbox", "replay", "-consumer", "billing", "-dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `dry run: replay would change 3 FAILED row(s) of "billing"`)
	require.Equal(t, 3, f.status(t, "FAILED"))

	// Replay one row by id.
	r = runCLI(t, f.schema, "inbox", "replay", "-consumer", "billing", "-id", strconv.FormatInt(f.rowID(t, "inv-1"), 10))
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `replayed 1 FAILED row(s) of "billing"`)
	require.Equal(t, "PENDING", f.rowStatus(t, "inv-1"))
	require.Equal(t, 0, pgtest.Count(t, f.db, `SELECT attempts FROM `+f.table("inbox")+` WHERE message_id = 'inv-1'`), "attempts reset")

	// Skip a key with a reason; the reason is kept.
	r = runCLI(t, f.schema, "inbox", "skip", "-consumer", "billing", "-key", "order-9", "-reason", "refunded by hand")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `skipped 1 FAILED row(s) of "billing"`)
	require.Equal(t, "SKIPPED", f.rowStatus(t, "inv-5"))
	require.Equal(t, 1, pgtest.Count(t, f.db, `SELECT count(*) FROM `+f.table("inbox")+` WHERE message_id = 'inv-5' AND last_error LIKE 'skipped: refunded by hand; last error: card declined%'`))

	// Unpark a key: its FAILED head goes back to PENDING, and the row behind it can follow.
	r = runCLI(t, f.schema, "inbox", "unpark", "-consumer", "billing", "-key", "order-7", "-dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "would change 1")
	require.Equal(t, "FAILED", f.rowStatus(t, "inv-3"))
	r = runCLI(t, f.schema, "inbox", "unpark", "-consumer", "billing", "-key", "order-7")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Equal(t, "PENDING", f.rowStatus(t, "inv-3"))

	// Nothing left to replay: said plainly, exit 0.
	r = runCLI(t, f.schema, "-json", "inbox", "replay", "-consumer", "billing")
	require.Equal(t, exitOK, r.code, r.stderr)
	var ch operate.ChangeResponse
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &ch))
	require.Equal(t, operate.ChangeResponse{Action: "replay", Consumer: "billing", Rows: 0}, ch)
	require.Equal(t, 0, f.status(t, "FAILED"))
	require.Equal(t, 3, f.status(t, "PENDING"))
}

func TestPurge(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	claims := f.table("processed_messages")
	// Age two of rewards' claims and one of another consumer by 40 days.
	pgtest.Exec(t, f.db, `UPDATE `+claims+` SET processed_at = now() - interval '40 days' WHERE message_id IN ('m-1', 'm-2')`)
	pgtest.Exec(t, f.db, `INSERT INTO `+claims+` (consumer, message_id, payload_sha256, processed_at) VALUES ('audit', 'a-1', '\x00', now() - interval '40 days')`)

	r := runCLI(t, f.schema, "purge", "-consumer", "rewards", "-older-than", "30d", "-dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `dry run: would delete 2 claim(s) of consumer "rewards" applied before `)
	require.Equal(t, 5, pgtest.Count(t, f.db, `SELECT count(*) FROM `+claims))

	r = runCLI(t, f.schema, "purge", "-consumer", "rewards", "-older-than", "720h")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `deleted 2 claim(s) of consumer "rewards"`)
	require.Contains(t, r.stdout, "no longer recognised as duplicates")
	require.Equal(t, 0, pgtest.Count(t, f.db, `SELECT count(*) FROM `+claims+` WHERE message_id IN ('m-1', 'm-2')`))
	require.Equal(t, 1, pgtest.Count(t, f.db, `SELECT count(*) FROM `+claims+` WHERE consumer = 'audit'`), "another consumer's claims stay")

	r = runCLI(t, f.schema, "purge", "-consumer", "rewards", "-before", "2999-01-01")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "is in the future")
	require.Equal(t, 2, pgtest.Count(t, f.db, `SELECT count(*) FROM `+claims+` WHERE consumer = 'rewards'`))

	r = runCLI(t, f.schema, "-json", "purge", "-all", "-before", time.Now().Add(-24*time.Hour).UTC().Format(time.RFC3339))
	require.Equal(t, exitOK, r.code, r.stderr)
	var out struct{ Claims int64 }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Equal(t, int64(1), out.Claims, "the audit claim")

	// A janitor round with a 30-day window: the finished inbox row aged 40 days goes, the
	// parked ones never do.
	pgtest.Exec(t, f.db, `UPDATE `+f.table("inbox")+` SET finished_at = now() - interval '40 days' WHERE message_id = 'inv-2'`)
	pgtest.Exec(t, f.db, `UPDATE `+f.table("inbox")+` SET received_at = now() - interval '40 days'`)
	r = runCLI(t, f.schema, "purge", "-janitor", "-keep", "30d")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "janitor round on schema "+f.schema)
	require.Regexp(t, `finished inbox rows:\s+1`, r.stdout)
	require.Equal(t, 0, pgtest.Count(t, f.db, `SELECT count(*) FROM `+f.table("inbox")+` WHERE message_id = 'inv-2'`))
	require.Equal(t, 3, f.status(t, "FAILED"))

	r = runCLI(t, f.schema, "purge", "-janitor", "-keep", "10s")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "must be at least 1m0s")

	// A slot no connector registered: the round says how to register it.
	r = runCLI(t, f.schema, "purge", "-janitor", "-keep", "30d", "-cdc-slots", "wmonce_unregistered")
	require.NotEqual(t, 0, r.code)
	require.Contains(t, r.stderr, "register it first")
	r = runCLI(t, f.schema, "purge", "-janitor", "-keep", "30d", "-cdc-slots", "Bad Slot")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "CDCSlots[0]")
}

func TestAdminCommandServesThePage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	var errOut strings.Builder
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"-database-url", pgtest.URL(), "-schema", f.schema, "admin", "-addr", "127.0.0.1:0"}, pw, &errOut)
		_ = pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	m := regexp.MustCompile(`on (http://\S+/)`).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	require.Contains(t, line, "(read-only)")

	res, err := http.Get(m[1] + "api/inbox/stats")
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	var stats operate.InboxStatsResponse
	require.NoError(t, json.NewDecoder(res.Body).Decode(&stats))
	require.Equal(t, int64(3), stats.Consumers[0].Failed)

	res, err = http.Get(m[1])
	require.NoError(t, err)
	page, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	require.Contains(t, string(page), "<title>watermill-once admin</title>")

	cancel()
	select {
	case code := <-done:
		require.Equal(t, exitOK, code, errOut.String())
	case <-time.After(10 * time.Second):
		t.Fatal("wmonce admin did not stop when its context was cancelled")
	}
}

// TestUnsetTimesAreNullInJSON: with nothing waiting, a relay's oldest_pending is null in the
// JSON, not "0001-01-01T00:00:00Z", and "-" in the table.
func TestUnsetTimesAreNullInJSON(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema, Name: "sms"}, nil)
	require.NoError(t, err)
	_, err = relay.RelayOnce(context.Background()) // an empty outbox: the relay's position, no backlog
	require.NoError(t, err)

	for _, args := range [][]string{{"-json", "outbox"}, {"-json", "status"}} {
		r := runCLI(t, schema, args...)
		require.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
		require.NotContains(t, r.stdout, "0001-01-01", args)
		require.Contains(t, r.stdout, `"oldest_pending": null`, args)
	}
	r := runCLI(t, schema, "outbox")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^\s+sms\s+0\s+-\s`, r.stdout)
}
