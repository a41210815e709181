package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// accounts is the aggregate the producers of these tests update: one row per key, whose
// version counts the transactions that committed on it. Producers serialise on its row lock,
// so version order is commit order.
type accounts struct {
	db     *sql.DB
	schema string
	w      *outbox.Writer
}

func newAccounts(t *testing.T, db *sql.DB, schema string, w *outbox.Writer, keys ...string) *accounts {
	t.Helper()
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "accounts")+` (id text PRIMARY KEY, version int NOT NULL)`)
	for _, k := range keys {
		pgtest.Exec(t, db, `INSERT INTO `+pgtx.QualifiedName(schema, "accounts")+` VALUES ($1, 0)`, k)
	}
	return &accounts{db: db, schema: schema, w: w}
}

// claim is the effectively-once middleware's first write: it gives the transaction its id.
func (a *accounts) claim(t *testing.T, tx *sql.Tx, id string) uint64 {
	t.Helper()
	var xid string
	err := tx.QueryRow(`INSERT INTO `+pgtx.QualifiedName(a.schema, "processed_messages")+` (consumer, message_id, payload_sha256)
VALUES ('accounts', $1, '\x00') RETURNING pg_current_xact_id()::text`, id).Scan(&xid)
	require.NoError(t, err)
	n, err := strconv.ParseUint(xid, 10, 64)
	require.NoError(t, err)
	return n
}

// apply locks the key's row, bumps its version and writes the event <key>/v<version> into the
// outbox after taking the lock, as the middleware does with a handler's outputs.
func (a *accounts) apply(ctx context.Context, tx *sql.Tx, key string) (int, error) {
	var v int
	if err := tx.QueryRowContext(ctx, `UPDATE `+pgtx.QualifiedName(a.schema, "accounts")+` SET version = version + 1 WHERE id = $1 RETURNING version`, key).Scan(&v); err != nil {
		return 0, err
	}
	msg := message.NewMessage(fmt.Sprintf("%s/v%d", key, v), []byte(`{}`))
	msg.Metadata.Set("partition_key", key)
	return v, a.w.PublishTx(ctx, tx, "accounts", msg)
}

// perKey splits published "<key>/v<n>" ids by key, in publish order.
func perKey(t *testing.T, ids []string) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for _, id := range ids {
		var key string
		var v int
		for i := len(id) - 1; i >= 0; i-- {
			if id[i] == '/' {
				key = id[:i]
				n, err := strconv.Atoi(id[i+2:])
				require.NoError(t, err, id)
				v = n
				break
			}
		}
		require.NotEmpty(t, key, id)
		out[key] = append(out[key], v)
	}
	return out
}

// The acceptance scenario: two handlers update one account row. The one that claimed first,
// and so holds the smaller transaction id, takes the row lock second and commits second.
func TestRelayPublishesAKeyInCommitOrderWhenTheFirstClaimerCommitsLast(t *testing.T) {
	t.Parallel()
	for _, lanes := range []int{1, 4} {
		t.Run(fmt.Sprintf("PublishLanes=%d", lanes), func(t *testing.T) {
			t.Parallel()
			db, schema, w := setup(t)
			acc := newAccounts(t, db, schema, w, "acct", "other")
			ctx := context.Background()

			first, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer first.Rollback()
			xidFirst := acc.claim(t, first, "m-1")

			second, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer second.Rollback()
			xidSecond := acc.claim(t, second, "m-2")
			require.Less(t, xidFirst, xidSecond, "the first claimer holds the smaller transaction id")
			v, err := acc.apply(ctx, second, "acct")
			require.NoError(t, err)
			require.Equal(t, 1, v)
			_, err = acc.apply(ctx, second, "other")
			require.NoError(t, err)
			require.NoError(t, second.Commit())

			// The first claimer now takes the lock and commits after the second.
			v, err = acc.apply(ctx, first, "acct")
			require.NoError(t, err)
			require.Equal(t, 2, v)
			require.NoError(t, first.Commit())

			s := newKeyedSink(3)
			r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, PublishLanes: lanes}, nil)
			require.NoError(t, err)
			for len(s.all()) < 3 {
				n, err := r.RelayOnce(ctx)
				require.NoError(t, err)
				require.NotZero(t, n, "the relay has nothing left to do, and published %v", s.all())
			}
			require.Equal(t, []int{1, 2}, perKey(t, s.all())["acct"], "published %v", s.all())
		})
	}
}

// Many writers on a few keys commit after random delays, while an unrelated transaction with
// an early id stays open across many of them. Each key must be published in the order its
// versions committed, every version exactly once.
func TestRelayKeepsPerKeyCommitOrderUnderConcurrentWriters(t *testing.T) {
	t.Parallel()
	for _, lanes := range []int{1, 8} {
		t.Run(fmt.Sprintf("PublishLanes=%d", lanes), func(t *testing.T) {
			t.Parallel()
			db := pgtest.OpenDB(t, 16)
			schema := pgtest.Schema(t, db)
			w, err := outbox.NewWriter(outbox.Config{Schema: schema})
			require.NoError(t, err)
			keys := []string{"k0", "k1", "k2"}
			acc := newAccounts(t, db, schema, w, keys...)
			ctx := context.Background()
			const writers, perWriter = 8, 10
			total := writers*perWriter + 1

			s := newKeyedSink(total)
			r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, BatchSize: 3, PublishLanes: lanes, PollInterval: time.Millisecond}, nil)
			require.NoError(t, err)
			runDone := make(chan error, 1)
			go func() { runDone <- r.Run(ctx) }()

			// The straddler claims before the writers start and commits after half of them.
			long, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer long.Rollback()
			acc.claim(t, long, "long")
			halfway := make(chan struct{})
			var committed atomic.Int64

			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for g := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					for i := range perWriter {
						err := func() error {
							tx, err := db.BeginTx(ctx, nil)
							if err != nil {
								return err
							}
							defer tx.Rollback()
							if _, err := tx.ExecContext(ctx, `INSERT INTO `+pgtx.QualifiedName(schema, "processed_messages")+` (consumer, message_id, payload_sha256) VALUES ('accounts', $1, '\x00')`, fmt.Sprintf("w%d-%d", g, i)); err != nil {
								return err
							}
							time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond) // perturbation, not a wait
							if _, err := acc.apply(ctx, tx, keys[rng.IntN(len(keys))]); err != nil {
								return err
							}
							time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
							return tx.Commit()
						}()
						if err != nil {
							errs <- err
							return
						}
						if committed.Add(1) == writers*perWriter/2 {
							close(halfway)
						}
					}
				}()
			}
			writersDone := make(chan struct{})
			go func() { wg.Wait(); close(writersDone) }()
			select {
			case <-halfway:
			case <-writersDone: // a writer failed; reported below
			}
			msg := message.NewMessage("unrelated/v1", []byte(`{}`))
			require.NoError(t, w.PublishTx(ctx, long, "accounts", msg))
			require.NoError(t, long.Commit())
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}

			select {
			case <-s.done:
			case <-time.After(30 * time.Second):
				t.Fatalf("relay published %d of %d", len(s.all()), total)
			}
			require.NoError(t, r.Close())
			require.NoError(t, <-runDone)

			got := perKey(t, s.all())
			sum := 0
			for _, k := range keys {
				var final int
				require.NoError(t, db.QueryRow(`SELECT version FROM `+pgtx.QualifiedName(schema, "accounts")+` WHERE id = $1`, k).Scan(&final))
				want := make([]int, final)
				for i := range want {
					want[i] = i + 1
				}
				require.Equal(t, want, got[k], "key %s: publish order must be commit order, each version once", k)
				sum += final
			}
			require.Equal(t, []int{1}, got["unrelated"])
			require.Equal(t, total, sum+1)
			require.Len(t, s.all(), total, "no duplicates without a crash")
		})
	}
}

// A transaction left open does not hold back rows that committed after it started: the relay
// publishes by visibility, not below the oldest running transaction.
func TestRelayIsNotHeldBackByAnOpenTransaction(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	open, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer open.Rollback()
	var xid string
	require.NoError(t, open.QueryRow(`SELECT pg_current_xact_id()::text`).Scan(&xid))

	publishTx(t, db, w, "a", "after-open")
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	n, err := r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"a/after-open"}, s.all())

	// Its own rows follow once it commits.
	msg := message.NewMessage("from-open", []byte(`{}`))
	require.NoError(t, w.PublishTx(ctx, open, "a", msg))
	require.NoError(t, open.Commit())
	n, err = r.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"a/after-open", "a/from-open"}, s.all())
}

// A round larger than BatchSize is published over several batches; rows that commit meanwhile
// wait for the next round; a relay that dies after the broker took a batch but before it
// recorded the position is replaced by one that publishes that batch again and nothing else
// twice.
func TestRelayRoundSpanningBatchesSurvivesRestart(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	for i := 1; i <= 7; i++ {
		publishTx(t, db, w, "a", fmt.Sprintf("r%d", i))
	}
	cfg := outbox.RelayConfig{Schema: schema, BatchSize: 2, Backoff: time.Millisecond, MaxBackoff: time.Millisecond}
	s := &sink{}
	r1, err := outbox.NewRelay(db, s, cfg, nil)
	require.NoError(t, err)
	ctx, crash := context.WithCancel(context.Background())
	defer crash()
	n, err := r1.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	relays, _, err := outbox.Stats(context.Background(), db, schema)
	require.NoError(t, err)
	require.Len(t, relays, 1)
	require.Equal(t, int64(5), relays[0].Backlog, "the round's unpublished rest")

	publishTx(t, db, w, "a", "late") // commits in the middle of the round

	var once sync.Once
	s.failOn = func(topic string, msgs []*message.Message) error {
		var err error
		once.Do(func() {
			for _, m := range msgs {
				s.got = append(s.got, topic+"/"+m.UUID)
			}
			crash()
			err = errors.New("relay died after the broker accepted the batch")
		})
		return err
	}
	_, err = r1.RelayOnce(ctx)
	require.Error(t, err)

	r2, err := outbox.NewRelay(db, s, cfg, nil)
	require.NoError(t, err)
	drain(t, r2, s, 10)
	require.Equal(t, []string{
		"a/r1", "a/r2",
		"a/r3", "a/r4", // published, then the relay died
		"a/r3", "a/r4", "a/r5", "a/r6", "a/r7",
		"a/late",
	}, s.all())
	n, err = r2.RelayOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
}

// Migration 006 turns a position of the old relay, (transaction_id, offset) of the last row it
// published, into a snapshot position: the relay resumes right after that row, skipping
// nothing, and a revert leaves a watermark an old relay can resume from.
func TestMigratedRelayPositionResumesAfterTheLastPublishedRow(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
	require.NoError(t, err)
	_, err = m.Migrate(ctx, migrate.DirectionDown, &migrate.Opts{TargetVersion: 5, MaxSteps: migrate.AllSteps})
	require.NoError(t, err)

	// The Writer of that schema version did not ask whether a relay waits (migration 008)
	old := outbox.WriterBefore013(w) // nor the columns of migration 013
	publishTx(t, db, old, "a", "old-1")
	publishTx(t, db, old, "a", "old-2", "old-3", "old-4")
	publishTx(t, db, old, "a", "new-1")
	ob := pgtx.QualifiedName(schema, "outbox")
	// The old relay published up to old-3, inside old-2's transaction.
	pgtest.Exec(t, db, `INSERT INTO `+pgtx.QualifiedName(schema, "outbox_offsets")+` (consumer_group, offset_acked, last_processed_transaction_id)
SELECT 'relay', "offset", transaction_id FROM `+ob+` WHERE uuid = 'old-3'`)
	pgtest.Exec(t, db, `INSERT INTO `+pgtx.QualifiedName(schema, "outbox_offsets")+` (consumer_group, offset_acked, last_processed_transaction_id) VALUES ('fresh', 0, '0')`)

	_, err = m.Migrate(ctx, migrate.DirectionUp, nil)
	require.NoError(t, err)
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	drain(t, r, s, 2)
	require.Equal(t, []string{"a/old-4", "a/new-1"}, s.all())
	fresh := &sink{}
	rf, err := outbox.NewRelay(db, fresh, outbox.RelayConfig{Schema: schema, Name: "fresh"}, nil)
	require.NoError(t, err)
	drain(t, rf, fresh, 5)
	require.Equal(t, []string{"a/old-1", "a/old-2", "a/old-3", "a/old-4", "a/new-1"}, fresh.all())

	// Reverted, the position is a watermark below every row not yet published: an old relay
	// resumes from it and may publish some rows again, but skips none.
	publishTx(t, db, w, "a", "unpublished")
	_, err = m.Migrate(ctx, migrate.DirectionDown, &migrate.Opts{TargetVersion: 5, MaxSteps: migrate.AllSteps})
	require.NoError(t, err)
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+ob+` t JOIN `+pgtx.QualifiedName(schema, "outbox_offsets")+` o ON o.consumer_group = 'relay'
WHERE t.uuid = 'unpublished' AND NOT ((t.transaction_id = o.last_processed_transaction_id AND t."offset" > o.offset_acked) OR t.transaction_id > o.last_processed_transaction_id)`))
}

// A row that commits while the relay publishes a round does not wait PollInterval: its
// notification wakes the relay, and without LISTEN a round that published is followed by the
// next one at once.
func TestRelayWaitsOnlyAfterAnEmptyRound(t *testing.T) {
	t.Parallel()
	for _, disableListen := range []bool{false, true} {
		t.Run(fmt.Sprintf("DisableListen=%v", disableListen), func(t *testing.T) {
			t.Parallel()
			db, schema, w := setup(t)
			publishTx(t, db, w, "a", "first")
			s := newKeyedSink(2)
			var once sync.Once
			pub := publishHook{Publisher: s, before: func() {
				// Commits while the relay publishes "first": the round that follows must find it.
				once.Do(func() { publishTx(t, db, w, "a", "second") })
			}}
			r, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema, BatchSize: 10, PollInterval: time.Hour, DisableListen: disableListen}, nil)
			require.NoError(t, err)
			runDone := make(chan error, 1)
			go func() { runDone <- r.Run(context.Background()) }()
			select {
			case <-s.done:
			case <-time.After(20 * time.Second):
				t.Fatalf("relay published %v and then waited PollInterval for a row that committed during a round", s.all())
			}
			require.NoError(t, r.Close())
			require.NoError(t, <-runDone)
			require.Equal(t, []string{"first", "second"}, s.all())
		})
	}
}

// publishHook runs before before every Publish.
type publishHook struct {
	message.Publisher
	before func()
}

func (p publishHook) Publish(topic string, msgs ...*message.Message) error {
	p.before()
	return p.Publisher.Publish(topic, msgs...)
}

// A relay stopped while the broker accepts a batch still records that batch, so a clean stop
// does not publish it again.
func TestRelayStoppedDuringPublishRecordsWhatWasPublished(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	publishTx(t, db, w, "a", "only")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	s := newKeyedSink(1)
	pub := publishHook{Publisher: s, before: stop} // the stop arrives while the batch is published
	r, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	require.NoError(t, r.Run(ctx))
	require.Equal(t, []string{"only"}, s.all())

	n, err := r.RelayOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "published again after a clean stop")
}
