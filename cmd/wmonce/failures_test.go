package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// `wmonce failures` lists the parked inbox rows as one group and a rejected outbox row as
// another; a dry run lists exactly the rows, -id touches exactly those, and each kind refuses
// the action it does not take.
func TestFailuresCommand(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// A row another program wrote: relay sms cannot decode it and sets it aside.
	pgtest.Exec(t, f.db, `INSERT INTO `+f.table("outbox")+` (uuid, payload, metadata, transaction_id) VALUES ('legacy-7', '{"x":1}', '{}', pg_current_xact_id())`)
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{Schema: f.schema, Name: "sms"}, nil)
	require.NoError(t, err)
	relayUntil(t, relay, "reject legacy-7", func(c outbox.RelayCounters) bool { return c.Rejected >= 1 })
	// A message the poison queue parked, last (it is the smallest group).
	w, err := outbox.NewWriter(outbox.Config{Schema: f.schema})
	require.NoError(t, err)
	poisoned := message.NewMessage("evt-17", []byte(`{}`))
	poisoned.Metadata.Set(middleware.ReasonForPoisonedKey, "permanent: unknown currency XYZ")
	poisoned.Metadata.Set(middleware.PoisonedTopicKey, "payments")
	poisoned.Metadata.Set(middleware.PoisonedHandlerKey, "ledger")
	require.NoError(t, w.ParkingPublisher(f.db).Publish("payments-poison", poisoned))

	r := runCLI(t, f.schema, "failures")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "card declined")
	require.Contains(t, r.stdout, "replay,skip")
	require.Contains(t, r.stdout, "envelope has no destination_topic")
	r = runCLI(t, f.schema, "-json", "failures")
	require.Equal(t, 0, r.code, r.stderr)
	var groups operate.FailureGroupsResponse
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &groups), r.stdout)
	require.Len(t, groups.Groups, 3)
	billing, parked, legacy := groups.Groups[0], groups.Groups[1], groups.Groups[2]
	require.Equal(t, "ledger", parked.Handler)
	require.Equal(t, "billing", billing.Consumer)
	require.Equal(t, int64(3), billing.Rows)
	require.Equal(t, "sms", legacy.Relay)

	ids := []int64{f.rowID(t, "inv-1"), f.rowID(t, "inv-3"), f.rowID(t, "inv-5")}
	r = runCLI(t, f.schema, "failures", "replay", billing.Fingerprint, "-dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("would replay 3 inbox row(s) of consumer billing (ids %d,%d,%d); nothing changed", ids[0], ids[1], ids[2]))
	require.Contains(t, r.stdout, fmt.Sprintf("wmonce failures replay %s -id %d,%d,%d", billing.Fingerprint, ids[0], ids[1], ids[2]))
	require.Equal(t, 3, f.status(t, "FAILED"), "a dry run changes nothing")
	r = runCLI(t, f.schema, "failures", "replay", billing.Fingerprint, "-id", fmt.Sprintf("%d,%d", ids[0], ids[1]))
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("replayed: 2 inbox row(s) of consumer billing (ids %d,%d)", ids[0], ids[1]))
	require.Equal(t, "PENDING", f.rowStatus(t, "inv-1"))
	require.Equal(t, "FAILED", f.rowStatus(t, "inv-5"), "not asked for")

	r = runCLI(t, f.schema, "failures", "skip", billing.Fingerprint)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "reason is required")
	r = runCLI(t, f.schema, "failures", "discard", billing.Fingerprint)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "inbox rows are not discarded")
	r = runCLI(t, f.schema, "failures", "skip", billing.Fingerprint, "-reason", "refunded by hand")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "SKIPPED", f.rowStatus(t, "inv-5"))

	r = runCLI(t, f.schema, "failures", "discard", legacy.Fingerprint, "-dry-run")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "would discard 1 rejected outbox row(s) of relay sms (offsets ")
	r = runCLI(t, f.schema, "failures", "discard", legacy.Fingerprint)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "discarded: 1 rejected outbox row(s) of relay sms")
	require.Zero(t, pgtest.Count(t, f.db, `SELECT count(*) FROM `+f.table("outbox_rejected")))

	r = runCLI(t, f.schema, "failures", "discard", parked.Fingerprint)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "discarded: 1 parked message(s) of handler ledger (offsets ")

	r = runCLI(t, f.schema, "failures", "replay", legacy.Fingerprint)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no failure group has fingerprint")
	r = runCLI(t, f.schema, "failures", "replay")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "give the group's fingerprint")
	r = runCLI(t, f.schema, "failures")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "no failure groups")
}

// refusingPublisher refuses every message for good, as a broker refuses a message too large.
type refusingPublisher struct{}

func (refusingPublisher) Publish(string, ...*message.Message) error {
	return wmonce.Permanent(errors.New("kafka server: Message was too large, server rejected it"))
}
func (refusingPublisher) Close() error { return nil }

// Four `wmonce failures replay` of one rejected group racing: one prints the three rows it
// republished and exits 0, the three others find nothing left to replay and exit 1, and one
// copy of each row is stored. Before, every run printed "replayed: 3 rejected outbox row(s)"
// (the offsets it had read before its transaction). The runs are held on a lock of the rows
// until all four wait on it, so that all of them read the group first.
func TestFailuresReplaysRacingReportWhatTheyDid(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	err = pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return w.PublishTx(ctx, tx, "big", message.NewMessage("b-1", nil), message.NewMessage("b-2", nil), message.NewMessage("b-3", nil))
	})
	require.NoError(t, err)
	relay, err := outbox.NewRelay(db, refusingPublisher{}, outbox.RelayConfig{Schema: schema, Name: "kafka"}, nil)
	require.NoError(t, err)
	relayUntil(t, relay, "reject the 3 rows", func(c outbox.RelayCounters) bool { return c.Rejected >= 3 })
	groups, _, err := outboxops.RejectedGroups(ctx, db, schema, 0)
	require.NoError(t, err)
	require.Len(t, groups, 1)
	fp := groups[0].Fingerprint

	lock, err := db.Begin()
	require.NoError(t, err)
	t.Cleanup(func() { _ = lock.Rollback() })
	_, err = lock.Exec(`SELECT 1 FROM ` + pgtx.QualifiedName(schema, "outbox_rejected") + ` FOR UPDATE`)
	require.NoError(t, err)
	const racers = 4
	results := make([]result, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runCLI(t, schema, "failures", "replay", fp)
		}()
	}
	testwait.Until(t, "the four replays to wait on the locked rows", func() bool {
		return pgtest.Count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, schema) == racers
	})
	require.NoError(t, lock.Rollback())
	wg.Wait()
	var replayed, notFound int
	for _, r := range results {
		switch r.code {
		case 0:
			replayed++
			require.Contains(t, r.stdout, "replayed: 3 rejected outbox row(s) of relay kafka", r.stdout)
		case 1:
			notFound++
			require.Contains(t, r.stderr, "no rejected group has fingerprint "+fp)
		default:
			t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
		}
	}
	require.Equal(t, 1, replayed, "%+v", results)
	require.Equal(t, racers-1, notFound, "%+v", results)
	require.Equal(t, 6, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")), "3 originals and one copy of each")
}
