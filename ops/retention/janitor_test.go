package retention_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/pgtx"
)

const day = 24 * time.Hour

func logger() watermill.LoggerAdapter {
	if testing.Verbose() {
		return watermill.NewStdLogger(false, false)
	}
	return watermill.NopLogger{}
}

func newJanitor(t *testing.T, db *sql.DB, cfg retention.Config) *retention.Janitor {
	t.Helper()
	j, err := retention.NewJanitor(db, cfg, logger())
	require.NoError(t, err)
	return j
}

// insertClaims writes n claims of consumer applied age ago (by the database clock).
func insertClaims(t *testing.T, db *sql.DB, schema, consumer string, n int, age time.Duration) {
	t.Helper()
	pgtest.Exec(t, db, `INSERT INTO `+pgtx.QualifiedName(schema, "processed_messages")+` (consumer, message_id, payload_sha256, processed_at)
SELECT $1, $1 || '-' || $3::text || '-' || g, '\x00', now() - $2::bigint * interval '1 microsecond'
FROM generate_series(1, $4::int) g`, consumer, age.Microseconds(), age.String(), n)
}

func countClaims(t *testing.T, db *sql.DB, schema, consumer string) int {
	t.Helper()
	return pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")+` WHERE consumer = $1`, consumer)
}

func TestClaimsExpirePerConsumerWindow(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	// "short" keeps 1 day, "long" 30 days, the others the default 7 days.
	j := newJanitor(t, db, retention.Config{
		Schema:    schema,
		Consumers: map[string]retention.Policy{"short": {Keep: day}, "long": {Keep: 30 * day}},
	})
	for _, c := range []string{"short", "long", "other"} {
		insertClaims(t, db, schema, c, 3, time.Hour)       // young for everyone
		insertClaims(t, db, schema, c, 4, 2*day)           // past "short" only
		insertClaims(t, db, schema, c, 5, 8*day)           // past the default too
		insertClaims(t, db, schema, c, 6, 31*day)          // past every window
		insertClaims(t, db, schema, c, 2, day-time.Minute) // just inside "short"
	}

	rep, err := j.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3+2, countClaims(t, db, schema, "short"))
	require.Equal(t, 3+4+5+2, countClaims(t, db, schema, "long"))
	require.Equal(t, 3+4+2, countClaims(t, db, schema, "other"))
	require.Equal(t, map[string]int64{"short": 4 + 5 + 6, "long": 6, "other": 5 + 6}, rep.ClaimsByConsumer)
	require.Equal(t, int64(15+6+11), rep.Claims)
	require.Equal(t, uint64(rep.Claims), j.Counters().Claims)

	// A second round finds nothing more.
	rep, err = j.RunOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, rep.Claims)
	require.Equal(t, uint64(2), j.Counters().Rounds)
}

func TestDeletesInBatchesOfOwnTransactions(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pm := pgtx.QualifiedName(schema, "processed_messages")
	log := pgtx.QualifiedName(schema, "delete_log")
	// A statement-level trigger records every DELETE: its transaction and how many rows it took.
	pgtest.Exec(t, db, `CREATE TABLE `+log+` (xid xid8 NOT NULL, n int NOT NULL)`)
	pgtest.Exec(t, db, `CREATE FUNCTION `+pgtx.QualifiedName(schema, "log_delete")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO `+log+` SELECT pg_current_xact_id(), count(*) FROM old_rows;
    RETURN NULL;
END $$`)
	pgtest.Exec(t, db, `CREATE TRIGGER log_delete AFTER DELETE ON `+pm+` REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION `+pgtx.QualifiedName(schema, "log_delete")+`()`)

	insertClaims(t, db, schema, "c", 1050, 10*day)
	insertClaims(t, db, schema, "c", 7, time.Hour)
	j := newJanitor(t, db, retention.Config{Schema: schema, BatchSize: 100})
	rep, err := j.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(1050), rep.Claims)
	require.Equal(t, 7, countClaims(t, db, schema, "c"))

	require.Equal(t, 11, pgtest.Count(t, db, `SELECT count(*) FROM `+log), "10 full batches and one short one")
	require.Equal(t, 100, pgtest.Count(t, db, `SELECT max(n) FROM `+log), "no statement deleted more than BatchSize")
	require.Equal(t, 1050, pgtest.Count(t, db, `SELECT sum(n) FROM `+log))
	require.Equal(t, 11, pgtest.Count(t, db, `SELECT count(DISTINCT xid) FROM `+log), "each batch is a transaction of its own")
}

func TestDailyPartitionsCreatedAheadAndDroppedPastLongestWindow(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	j := newJanitor(t, db, retention.Config{
		Schema:          schema,
		Default:         retention.Policy{Keep: 2 * day},
		Consumers:       map[string]retention.Policy{"slow": {Keep: 5 * day}},
		PartitionsAhead: 2,
	})

	// Not in use: the janitor creates nothing.
	rep, err := j.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.DailyPartitionsCreated)
	days, err := partition.List(ctx, db, schema)
	require.NoError(t, err)
	require.Empty(t, days)

	var now time.Time
	require.NoError(t, db.QueryRow(`SELECT now()`).Scan(&now))
	today := partition.Day(now)
	// In use: days from 8 days ago to 3 days ago, one claim in each.
	require.NoError(t, partition.Ensure(ctx, db, schema, today.AddDate(0, 0, -8), today.AddDate(0, 0, -3)))
	daily := pgtx.QualifiedName(schema, partition.Parent)
	pgtest.Exec(t, db, `INSERT INTO `+daily+` (consumer, message_id, occurred_on, payload_sha256)
SELECT 'c', 'm' || g, $1::date + g, '\x00' FROM generate_series(0, 5) g`, today.AddDate(0, 0, -8))

	rep, err = j.RunOnce(ctx)
	require.NoError(t, err)
	// The longest window is 5 days: a day goes once it ended more than 5 days ago, i.e. days
	// before (now - 5 days)'s day.
	cutoff := partition.Day(now.Add(-5 * day))
	var want []time.Time
	for d := cutoff; !d.After(today.AddDate(0, 0, 2)); d = d.AddDate(0, 0, 1) {
		if d.Before(today.AddDate(0, 0, -2)) || !d.Before(today) {
			want = append(want, d)
		}
	}
	days, err = partition.List(ctx, db, schema)
	require.NoError(t, err)
	require.Equal(t, want, days, "expired days dropped, today and 2 days ahead created")
	require.Equal(t, int64(cutoff.Sub(today.AddDate(0, 0, -8))/day), rep.DailyPartitionsDropped)
	require.Equal(t, int64(3), rep.DailyPartitionsCreated)
	require.Equal(t, int(today.AddDate(0, 0, -3).Sub(cutoff)/day)+1, pgtest.Count(t, db, `SELECT count(*) FROM `+daily),
		"claims of the days kept survive")
	require.Equal(t, uint64(rep.DailyPartitionsDropped), j.Counters().DailyPartitionsDropped)
}

func TestInboxFinishedRowsDeletedOthersKept(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ib := pgtx.QualifiedName(schema, "inbox")
	insert := func(consumer, status string, finishedAgo time.Duration) {
		t.Helper()
		finished := "NULL"
		if status == "DONE" || status == "SKIPPED" {
			finished = fmt.Sprintf("now() - interval '%d seconds'", int64(finishedAgo.Seconds()))
		}
		token, lease := "NULL", "NULL"
		if status == "IN_PROGRESS" {
			token, lease = "1", "now() + interval '1 minute'"
		}
		pgtest.Exec(t, db, `INSERT INTO `+ib+` (consumer, message_id, message_uuid, payload, status, claim_token, lease_until, received_at, finished_at)
VALUES ($1, $2, $2, '\x00', $3, `+token+`, `+lease+`, now() - interval '60 days', `+finished+`)`, consumer, pgtest.NewName("m"), status)
	}
	for _, c := range []string{"orders", "audit"} {
		insert(c, "DONE", 10*day)
		insert(c, "DONE", 10*day)
		insert(c, "SKIPPED", 10*day)
		insert(c, "DONE", 3*day)
		insert(c, "DONE", time.Hour)
		insert(c, "FAILED", 0)
		insert(c, "PENDING", 0)
		insert(c, "IN_PROGRESS", 0)
	}
	count := func(consumer string) int {
		return pgtest.Count(t, db, `SELECT count(*) FROM `+ib+` WHERE consumer = $1`, consumer)
	}

	// One window for everyone: finished rows older than 7 days go.
	j := newJanitor(t, db, retention.Config{Schema: schema})
	rep, err := j.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(6), rep.InboxRows)
	require.Equal(t, map[string]int64{"orders": 3, "audit": 3}, rep.InboxRowsByConsumer)
	require.Equal(t, uint64(6), j.Counters().InboxRows)
	require.Equal(t, 5, count("orders"))
	require.Equal(t, 5, count("audit"))

	// A listed consumer's own window applies to its inbox rows too.
	j = newJanitor(t, db, retention.Config{Schema: schema, Consumers: map[string]retention.Policy{"orders": {Keep: 2 * day}}})
	rep, err = j.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"orders": 1}, rep.InboxRowsByConsumer)
	require.Equal(t, 4, count("orders"))
	require.Equal(t, 5, count("audit"))
	require.Equal(t, 2, pgtest.Count(t, db, `SELECT count(*) FROM `+ib+` WHERE status = 'FAILED'`), "FAILED rows are never deleted")
	require.Equal(t, 4, pgtest.Count(t, db, `SELECT count(*) FROM `+ib+` WHERE status IN ('PENDING', 'IN_PROGRESS')`))
}

func TestHTTPKeysDeletedOnlyWhenConfigured(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	keys := pgtx.QualifiedName(schema, "http_idempotency_keys")
	pgtest.Exec(t, db, `INSERT INTO `+keys+` (scope, idem_key, fingerprint, method, request_uri, response_status, response_headers, response_body, created_at)
SELECT 's', 'k' || g, '\x00', 'POST', '/', 200, '{}', '', now() - g * interval '1 hour' FROM generate_series(1, 48) g`)
	rep, err := newJanitor(t, db, retention.Config{Schema: schema}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, rep.HTTPKeys)
	rep, err = newJanitor(t, db, retention.Config{Schema: schema, HTTPKeysKeep: 24*time.Hour + 30*time.Minute}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(24), rep.HTTPKeys)
	require.Equal(t, 24, pgtest.Count(t, db, `SELECT count(*) FROM `+keys))
}

// Rejected outbox rows and SENT intents are kept unless their Keep is set; then only the old
// ones go, and intents that are not SENT stay whatever their age.
func TestRejectedRowsAndSentIntentsDeletedOnlyWhenConfigured(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	rejected := pgtx.QualifiedName(schema, "outbox_rejected")
	intents := pgtx.QualifiedName(schema, "intents")
	pgtest.Exec(t, db, `INSERT INTO `+rejected+` (relay, "offset", transaction_id, uuid, error, rejected_at)
SELECT 'relay', g, '1', 'u' || g, 'bad json', now() - g * interval '1 hour' FROM generate_series(1, 48) g`)
	pgtest.Exec(t, db, `INSERT INTO `+intents+` (channel, intent_key, consumer, event_id, step, payload, status, provider_id, sent_at, created_at)
SELECT 'sms', 'k' || g, 'c', 'e' || g, 's', '\x00', 'SENT', 'p' || g, now() - g * interval '1 hour', now() - g * interval '1 hour'
FROM generate_series(1, 48) g`)
	pgtest.Exec(t, db, `INSERT INTO `+intents+` (channel, intent_key, consumer, event_id, step, payload, status, created_at)
SELECT 'sms', 'f' || g, 'c', 'f' || g, 's', '\x00', 'FAILED', now() - interval '30 days' FROM generate_series(1, 3) g`)

	rep, err := newJanitor(t, db, retention.Config{Schema: schema}).RunOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, rep.OutboxRejected)
	require.Zero(t, rep.SentIntents)
	require.Equal(t, 48, pgtest.Count(t, db, `SELECT count(*) FROM `+rejected))

	j := newJanitor(t, db, retention.Config{Schema: schema, OutboxRejectedKeep: 24*time.Hour + 30*time.Minute, SentIntentsKeep: 12*time.Hour + 30*time.Minute})
	rep, err = j.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(24), rep.OutboxRejected)
	require.Equal(t, int64(36), rep.SentIntents)
	require.Equal(t, 24, pgtest.Count(t, db, `SELECT count(*) FROM `+rejected))
	require.Equal(t, 12, pgtest.Count(t, db, `SELECT count(*) FROM `+intents+` WHERE status = 'SENT'`))
	require.Equal(t, 3, pgtest.Count(t, db, `SELECT count(*) FROM `+intents+` WHERE status = 'FAILED'`), "FAILED intents need attention: never deleted")
	require.Equal(t, uint64(24), j.Counters().OutboxRejected)
	require.Equal(t, uint64(36), j.Counters().SentIntents)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	for _, tc := range []struct {
		name string
		cfg  retention.Config
		want string
	}{
		{"schema", retention.Config{Schema: "Bad-Schema"}, "schema name"},
		{"keep in nanoseconds", retention.Config{Default: retention.Policy{Keep: 7}}, "Default.Keep is 7ns"},
		{"negative consumer keep", retention.Config{Consumers: map[string]retention.Policy{"a": {Keep: -day}}}, `Consumers["a"].Keep`},
		{"blank consumer", retention.Config{Consumers: map[string]retention.Policy{" ": {Keep: day}}}, "consumer name is blank"},
		{"NUL in consumer", retention.Config{Consumers: map[string]retention.Policy{"a\x00b": {Keep: day}}}, "consumer name must not contain NUL bytes"},
		{"negative horizon", retention.Config{Default: retention.Policy{RedeliveryHorizon: -time.Hour}}, "Default.RedeliveryHorizon"},
		{"inbox keep", retention.Config{InboxKeep: time.Second}, "InboxKeep"},
		{"outbox keep", retention.Config{OutboxKeep: -time.Second}, "OutboxKeep"},
		{"http keys", retention.Config{HTTPKeysKeep: time.Millisecond}, "HTTPKeysKeep"},
		{"rejected keep", retention.Config{OutboxRejectedKeep: time.Millisecond}, "OutboxRejectedKeep"},
		{"sent intents keep", retention.Config{SentIntentsKeep: -time.Hour}, "SentIntentsKeep"},
		{"batch", retention.Config{BatchSize: 200000}, "BatchSize"},
		{"interval", retention.Config{PollInterval: -time.Second}, "PollInterval"},
		{"partitions", retention.Config{PartitionsAhead: 1000}, "PartitionsAhead"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, tc.cfg.Validate(), tc.want)
			_, err := retention.NewJanitor(db, tc.cfg, nil)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := retention.NewJanitor(nil, retention.Config{}, nil)
	require.ErrorContains(t, err, "db is nil")

	// Zero values take the documented defaults; a listed consumer without Keep inherits the default's.
	j, err := retention.NewJanitor(db, retention.Config{Consumers: map[string]retention.Policy{"a": {RedeliveryHorizon: day}}}, nil)
	require.NoError(t, err)
	cfg := j.Config()
	require.Equal(t, pgtx.DefaultSchema, cfg.Schema)
	require.Equal(t, 7*day, cfg.Default.Keep)
	require.Equal(t, 7*day, cfg.Consumers["a"].Keep)
	require.Equal(t, 7*day, cfg.InboxKeep)
	require.Equal(t, day, cfg.OutboxKeep)
	require.Equal(t, 5000, cfg.BatchSize)
	require.Equal(t, time.Minute, cfg.PollInterval)
	require.Equal(t, 3, cfg.PartitionsAhead)
	require.Zero(t, cfg.HTTPKeysKeep)
	require.Empty(t, j.Warnings())
}

func TestWarnsWhenRetentionShorterThanRedeliveryHorizon(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	logs := watermill.NewCaptureLogger()
	j, err := retention.NewJanitor(db, retention.Config{
		Default: retention.Policy{Keep: 3 * day, RedeliveryHorizon: 2 * day},
		Consumers: map[string]retention.Policy{
			"kafka-orders": {Keep: day, RedeliveryHorizon: 7 * day}, // offset reset can reach back a week
			"covered":      {Keep: 14 * day, RedeliveryHorizon: 7 * day},
			"undeclared":   {Keep: day},
		},
		InboxKeep: day,
	}, logs)
	require.NoError(t, err, "a short window is a warning, not a refusal")

	w := j.Warnings()
	require.Len(t, w, 2)
	require.Contains(t, w[0], "InboxKeep 24h0m0s")
	require.Contains(t, w[0], "redelivery horizon (48h0m0s)")
	require.Contains(t, w[1], `consumer "kafka-orders" (Keep 24h0m0s)`)
	require.Contains(t, w[1], "redelivery horizon (168h0m0s)")
	require.Contains(t, w[1], "applied twice")

	var logged []string
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		logged = append(logged, m.Msg)
	}
	require.Len(t, logged, 2)
	for i := range w {
		require.True(t, strings.HasSuffix(logged[i], w[i]), "logged at error level: %q", logged[i])
	}
}
