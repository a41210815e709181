package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// writerColumns are the columns of an outbox row a Writer fills, as text (payload and metadata
// as jsonb, so that key order does not matter; payload_bytes hex-encoded). NULL is "<null>".
const writerColumns = `coalesce(uuid, '<null>'), coalesce(destination, '<null>'), coalesce(partition_key, '<null>'),
coalesce(type, '<null>'), coalesce(encode(payload_bytes, 'hex'), '<null>'), coalesce(payload::jsonb::text, '<null>'),
coalesce(metadata::jsonb::text, '<null>'), coalesce(source, '<null>')`

type outboxRow [8]string

func rowsOf(t *testing.T, db *sql.DB, schema, uuid string) []outboxRow {
	t.Helper()
	rows, err := pgtx.QueryAll(context.Background(), db, func(s pgtx.Scanner) (outboxRow, error) {
		var r outboxRow
		err := s.Scan(&r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &r[6], &r[7])
		return r, err
	}, `SELECT `+writerColumns+` FROM `+pgtx.QualifiedName(schema, "outbox")+` WHERE uuid = $1 ORDER BY "offset"`, uuid)
	require.NoError(t, err)
	return rows
}

// rejectAll stores msgs for topic with w and lets a relay of source reject every one of them.
func rejectAll(t *testing.T, db *sql.DB, schema, source string, w *outbox.Writer, topic string, msgs ...*message.Message) *outbox.Relay {
	t.Helper()
	err := pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return w.PublishTx(ctx, tx, topic, msgs...)
	})
	require.NoError(t, err)
	s := &sink{failOn: func(string, []*message.Message) error {
		return wmonce.Permanent(errors.New("kafka server: Message was too large, server rejected it"))
	}}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, Source: source}, nil)
	require.NoError(t, err)
	for r.Counters().Rejected < uint64(len(msgs)) {
		require.NotZero(t, relayOnce(t, r), "the relay stopped with %d of %d rows rejected", r.Counters().Rejected, len(msgs))
	}
	return r
}

// A republished row is a row of the Writer: the envelope the Relay reads and every column of
// migration 013 Debezium's Outbox Event Router reads (destination, partition_key, type,
// payload_bytes), the same as the original's, with its source; with RemoveMetadata, the same
// but for the removed key, in the envelope and the metadata column alike. Before, the
// republished row had NULL destination, partition_key and payload_bytes, which stops
// Debezium's task.
func TestRepublishedRowsCarryTheWritersColumns(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	w, err := outbox.NewWriter(outbox.Config{Schema: schema, Source: "billing", PartitionKeyField: "account"})
	require.NoError(t, err)
	var msgs []*message.Message
	for _, u := range []string{"r-1", "r-2", "r-3"} {
		m := message.NewMessage(u, []byte{0xff, 0x00, 'x'})
		m.Metadata.Set("account", "acc-7")
		m.Metadata.Set(outbox.MetadataEventType, "InvoicePaid")
		m.Metadata.Set("reserved", "drop me")
		msgs = append(msgs, m)
	}
	plain := message.NewMessage("r-plain", nil) // no payload, no key: keyed by its UUID
	msgs = append(msgs, plain)
	rejectAll(t, db, schema, "billing", w, "invoices", msgs...)
	rejected, err := outboxops.ListRejected(ctx, db, schema, outboxops.RejectedFilter{}, 10, false)
	require.NoError(t, err)
	require.Len(t, rejected, 4)

	// The CLI's and the admin page's default PartitionKeyField: the original rows are still
	// there, and give their partition keys.
	res, err := outboxops.RepublishRejected(ctx, db, schema, outboxops.RepublishRequest{Relay: "relay", Offsets: []int64{rejected[0].Offset, rejected[3].Offset}})
	require.NoError(t, err)
	require.Equal(t, []int64{rejected[0].Offset, rejected[3].Offset}, res.Offsets)
	for _, u := range []string{"r-1", "r-plain"} {
		rows := rowsOf(t, db, schema, u)
		require.Len(t, rows, 2, u)
		require.Equal(t, rows[0], rows[1], "the republished row of %s carries what the Writer's row carries", u)
		for _, i := range []int{1, 2, 4} { // destination, partition_key, payload_bytes
			require.NotEqual(t, "<null>", rows[1][i], "column %d of the republished %s", i, u)
		}
	}
	require.Equal(t, "r-plain", rowsOf(t, db, schema, "r-plain")[1][2], "partition_key: the UUID")

	// Once retention has deleted the originals, RepublishRequest.PartitionKeyField keys them.
	before := map[string]outboxRow{"r-2": rowsOf(t, db, schema, "r-2")[0], "r-3": rowsOf(t, db, schema, "r-3")[0]}
	pgtest.Exec(t, db, `DELETE FROM `+pgtx.QualifiedName(schema, "outbox")+` WHERE uuid IN ('r-2', 'r-3')`)
	res, err = outboxops.RepublishRejected(ctx, db, schema, outboxops.RepublishRequest{Relay: "relay", All: true, RemoveMetadata: []string{"reserved"}, PartitionKeyField: "account"})
	require.NoError(t, err)
	require.Equal(t, 2, res.Republished)
	for _, u := range []string{"r-2", "r-3"} {
		rows := rowsOf(t, db, schema, u)
		require.Len(t, rows, 1, u)
		orig, again := before[u], rows[0]
		require.Contains(t, orig[6], `"reserved"`)
		require.NotContains(t, again[6], `"reserved"`, "metadata column")
		require.NotContains(t, again[5], `"reserved"`, "envelope")
		orig[5], orig[6], again[5], again[6] = "", "", "", ""
		require.Equal(t, orig, again, u)
	}
	// The republished rows reach a relay of their source as they were stored.
	s := &sink{}
	r2, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, Source: "billing", Name: "fresh"}, nil)
	require.NoError(t, err)
	drain(t, r2, s, 6)
}

// lockRejected locks every row of outbox_rejected in a transaction of its own, so that the
// calls the test starts next all read their group before any of them can change it; release
// lets them go.
func lockRejected(t *testing.T, db *sql.DB, schema string) (release func()) {
	t.Helper()
	tx, err := db.Begin()
	require.NoError(t, err)
	_, err = tx.Exec(`SELECT 1 FROM ` + pgtx.QualifiedName(schema, "outbox_rejected") + ` FOR UPDATE`)
	require.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback() }) }
	t.Cleanup(release)
	return release
}

// waitLockWaiters waits until n statements on schema's tables wait for a row lock.
func waitLockWaiters(t *testing.T, db *sql.DB, schema string, n int) {
	t.Helper()
	testwait.Until(t, "the concurrent calls to wait on the locked rows", func() bool {
		return pgtest.Count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, schema) == n
	})
}

// Of four concurrent republishes of one rejected group, one reports the three rows and the
// others none, and one copy of each row is stored; the same for four concurrent discards.
// Before, every call reported the offsets it had read before its transaction.
func TestConcurrentGroupActionsReportWhatTheirTransactionChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const racers = 4
	for _, action := range []string{"republish", "discard"} {
		db, schema, w := setup(t)
		uuids := []string{action + "-1", action + "-2", action + "-3"}
		var msgs []*message.Message
		for _, u := range uuids {
			msgs = append(msgs, message.NewMessage(u, []byte(u)))
		}
		rejectAll(t, db, schema, "", w, "t-"+action, msgs...)
		groups, _, err := outboxops.RejectedGroups(ctx, db, schema, 0)
		require.NoError(t, err)
		require.Len(t, groups, 1)
		fp := groups[0].Fingerprint

		release := lockRejected(t, db, schema)
		results := make([]outboxops.RejectedGroupResult, racers)
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := outboxops.RejectedGroupRequest{Fingerprint: fp}
				if action == "republish" {
					results[i], errs[i] = outboxops.RepublishRejectedGroup(ctx, db, schema, req)
				} else {
					results[i], errs[i] = outboxops.DiscardRejectedGroup(ctx, db, schema, req)
				}
			}()
		}
		waitLockWaiters(t, db, schema, racers)
		release()
		wg.Wait()
		reported, winners := 0, 0
		for i := range racers {
			require.NoError(t, errs[i])
			reported += len(results[i].Offsets)
			if len(results[i].Offsets) > 0 {
				winners++
			}
		}
		require.Equal(t, 3, reported, "%s: rows reported by %d concurrent calls: %+v", action, racers, results)
		require.Equal(t, 1, winners, action)
		require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox_rejected")))
		copies := 0
		if action == "republish" {
			copies = 1
		}
		for _, u := range uuids {
			require.Len(t, rowsOf(t, db, schema, u), 1+copies, "%s: rows of %s", action, u)
		}
	}
}
