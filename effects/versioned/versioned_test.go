package versioned_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/versioned"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

type env struct {
	db     *sql.DB
	schema string
	v      *versioned.Versions
	mw     *once.Middleware
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	v, err := versioned.New(versioned.Config{Schema: schema})
	require.NoError(t, err)
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "ledger"}, nil)
	require.NoError(t, err)
	return &env{db: db, schema: schema, v: v, mw: mw}
}

func (e *env) table(name string) string { return pgtx.QualifiedName(e.schema, name) }

type event struct {
	Account string `json:"account"`
	Version int64  `json:"version"`
	Add     int64  `json:"add,omitempty"`
	Email   string `json:"email,omitempty"`
}

func deliver(t *testing.T, h message.HandlerFunc, uuid string, ev event) error {
	t.Helper()
	payload, err := json.Marshal(ev)
	require.NoError(t, err)
	_, err = h(message.NewMessage(uuid, payload))
	return err
}

func TestDeltasWaitForGapsAndSkipCopies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pgtest.Exec(t, e.db, `CREATE TABLE `+e.table("balances")+` (account text PRIMARY KEY, paise bigint NOT NULL, applied text[] NOT NULL)`)
	var outcomes []versioned.Outcome
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		var ev event
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return nil, wmonce.Permanent(err)
		}
		tx, _ := pgtx.TxFromContext(msg.Context())
		res, err := e.v.ApplyDelta(msg.Context(), tx, versioned.Entity{Type: "account", ID: ev.Account}, ev.Version, func(ctx context.Context) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+e.table("balances")+` VALUES ($1, $2, ARRAY[$3])
ON CONFLICT (account) DO UPDATE SET paise = balances.paise + EXCLUDED.paise, applied = balances.applied || EXCLUDED.applied`, ev.Account, ev.Add, msg.UUID)
			return err
		})
		if err == nil {
			outcomes = append(outcomes, res.Outcome)
		}
		return nil, err
	})
	balance := func() (int64, []string) {
		var paise int64
		var applied string
		err := e.db.QueryRow(`SELECT paise, array_to_string(applied, ',') FROM `+e.table("balances")+` WHERE account = 'acc-1'`).Scan(&paise, &applied)
		require.NoError(t, err)
		return paise, strings.Split(applied, ",")
	}
	claims := func(id string) int {
		return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("processed_messages")+` WHERE message_id = $1`, id)
	}

	require.NoError(t, deliver(t, h, "m1", event{Account: "acc-1", Version: 1, Add: 100}))

	// Version 3 overtakes version 2: it must wait. The error is retryable, so the router nacks
	// and the broker redelivers later; the claim rolled back with it.
	err := deliver(t, h, "m3", event{Account: "acc-1", Version: 3, Add: 300})
	require.ErrorIs(t, err, versioned.ErrVersionGap)
	require.False(t, wmonce.IsPermanent(err), "a gap is retried, never parked")
	var gap *versioned.GapError
	require.ErrorAs(t, err, &gap)
	require.Equal(t, int64(1), gap.Stored)
	require.Equal(t, int64(3), gap.Got)
	require.Zero(t, claims("m3"), "the nacked message left no claim, so its redelivery will run")

	require.NoError(t, deliver(t, h, "m2", event{Account: "acc-1", Version: 2, Add: 200}))
	require.NoError(t, deliver(t, h, "m3", event{Account: "acc-1", Version: 3, Add: 300}), "the redelivery applies once the gap is filled")
	paise, applied := balance()
	require.Equal(t, int64(600), paise)
	require.Equal(t, []string{"m1", "m2", "m3"}, applied, "applied in version order")

	// A redelivered copy is absorbed by the dedupe claim; the same version republished under a
	// new message id is absorbed by the version check.
	require.NoError(t, deliver(t, h, "m2", event{Account: "acc-1", Version: 2, Add: 200}))
	require.NoError(t, deliver(t, h, "m2-republished", event{Account: "acc-1", Version: 2, Add: 200}))
	paise, _ = balance()
	require.Equal(t, int64(600), paise)
	require.Equal(t, []versioned.Outcome{versioned.Applied, versioned.Applied, versioned.Applied, versioned.Stale}, outcomes)
	require.Equal(t, 1, claims("m2-republished"), "the stale copy was acked (claimed) and skipped")

	cur, err := e.v.Current(context.Background(), e.db, versioned.Entity{Type: "account", ID: "acc-1"})
	require.NoError(t, err)
	require.Equal(t, int64(3), cur)

	// A gap on a new entity: nothing stored, version 2 waits for 1.
	err = deliver(t, h, "n2", event{Account: "acc-2", Version: 2, Add: 1})
	require.ErrorAs(t, err, &gap)
	require.Equal(t, int64(0), gap.Stored)

	// A version below the first one is poison: permanent, parked by the Stack.
	err = deliver(t, h, "bad", event{Account: "acc-1", Version: 0, Add: 1})
	require.ErrorIs(t, err, versioned.ErrInvalid)
	require.True(t, wmonce.IsPermanent(err))
}

func TestFullStateSkipsStaleCopies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pgtest.Exec(t, e.db, `CREATE TABLE `+e.table("profiles")+` (account text PRIMARY KEY, email text NOT NULL)`)
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		var ev event
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return nil, wmonce.Permanent(err)
		}
		tx, _ := pgtx.TxFromContext(msg.Context())
		_, err := e.v.ApplyState(msg.Context(), tx, versioned.Entity{Type: "profile", ID: ev.Account}, ev.Version, func(ctx context.Context) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+e.table("profiles")+` VALUES ($1, $2) ON CONFLICT (account) DO UPDATE SET email = EXCLUDED.email`, ev.Account, ev.Email)
			return err
		})
		return nil, err
	})
	email := func() string {
		var s string
		require.NoError(t, e.db.QueryRow(`SELECT email FROM `+e.table("profiles")+` WHERE account = 'acc-1'`).Scan(&s))
		return s
	}
	require.NoError(t, deliver(t, h, "p5", event{Account: "acc-1", Version: 5, Email: "v5@example.com"}), "full state may start anywhere")
	require.NoError(t, deliver(t, h, "p4", event{Account: "acc-1", Version: 4, Email: "v4@example.com"}), "a stale copy is acked")
	require.Equal(t, "v5@example.com", email(), "and skipped: state never goes backwards")
	require.NoError(t, deliver(t, h, "p7", event{Account: "acc-1", Version: 7, Email: "v7@example.com"}), "gaps are fine for full state")
	require.Equal(t, "v7@example.com", email())
	require.NoError(t, deliver(t, h, "p7-again", event{Account: "acc-1", Version: 7, Email: "other@example.com"}))
	require.Equal(t, "v7@example.com", email(), "an equal version is not newer")
	require.Equal(t, 4, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("processed_messages")), "every message was acked")
}

func TestConcurrentAppliesOfOneVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ent := versioned.Entity{Type: "order", ID: "ord-1"}
	require.NoError(t, pgtx.RunInTx(ctx, e.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		_, err := e.v.ApplyDelta(ctx, tx, ent, 1, nil)
		return err
	}))
	const n = 8
	var wg sync.WaitGroup
	results := make(chan versioned.Outcome, n)
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := pgtx.RunInTx(ctx, e.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
				res, err := e.v.ApplyDelta(ctx, tx, ent, 2, nil)
				if err == nil {
					results <- res.Outcome
				}
				return err
			})
			if err != nil {
				results <- 0
			}
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	counts := map[versioned.Outcome]int{}
	for o := range results {
		counts[o]++
	}
	require.Equal(t, map[versioned.Outcome]int{versioned.Applied: 1, versioned.Stale: n - 1}, counts)
}

func TestApplyErrorIsReturnedAndStartAtZero(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ent := versioned.Entity{Type: "t", ID: "1"}
	boom := errors.New("boom")
	err := pgtx.RunInTx(ctx, e.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		_, err := e.v.ApplyDelta(ctx, tx, ent, 1, func(context.Context) error { return boom })
		return err
	})
	require.ErrorIs(t, err, boom)
	cur, err := e.v.Current(ctx, e.db, ent)
	require.NoError(t, err)
	require.Zero(t, cur, "the version rolled back with the failed apply")

	zero, err := versioned.New(versioned.Config{Schema: e.schema, StartAtZero: true})
	require.NoError(t, err)
	other := versioned.Entity{Type: "t", ID: "2"}
	require.NoError(t, pgtx.RunInTx(ctx, e.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		res, err := zero.ApplyDelta(ctx, tx, other, 0, nil)
		require.Equal(t, versioned.Applied, res.Outcome)
		return err
	}))
	cur, err = zero.Current(ctx, e.db, versioned.Entity{Type: "t", ID: "new"})
	require.NoError(t, err)
	require.Equal(t, int64(-1), cur)

	// SetVersion unblocks an entity whose missing delta will never come.
	require.NoError(t, e.v.SetVersion(ctx, e.db, ent, 9))
	require.NoError(t, pgtx.RunInTx(ctx, e.db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		res, err := e.v.ApplyDelta(ctx, tx, ent, 10, nil)
		require.Equal(t, versioned.Applied, res.Outcome)
		return err
	}))

	_, err = versioned.New(versioned.Config{Schema: "no such"})
	require.ErrorContains(t, err, "invalid config")
	_, err = e.v.ApplyState(ctx, e.db, versioned.Entity{Type: "", ID: "x"}, 1, nil)
	require.ErrorIs(t, err, versioned.ErrInvalid)
}

// TestVersionsAre64Bit: versions above 2^31-1 (millisecond timestamps) apply, gap and go
// stale like small ones; every query binds the version as bigint.
func TestVersionsAre64Bit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const ms = int64(1_764_528_000_000) // 2025-11-30 in Unix milliseconds
	inTx := func(f func(tx *sql.Tx) (versioned.Result, error)) (versioned.Result, error) {
		t.Helper()
		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		r, err := f(tx)
		if err == nil {
			require.NoError(t, tx.Commit())
		}
		return r, err
	}
	delta := func(ent versioned.Entity, v int64) (versioned.Result, error) {
		return inTx(func(tx *sql.Tx) (versioned.Result, error) { return e.v.ApplyDelta(ctx, tx, ent, v, nil) })
	}
	state := func(ent versioned.Entity, v int64) (versioned.Result, error) {
		return inTx(func(tx *sql.Tx) (versioned.Result, error) { return e.v.ApplyState(ctx, tx, ent, v, nil) })
	}

	// A new entity whose first delta is far ahead: a gap, not an encoding error.
	fresh := versioned.Entity{Type: "account", ID: "new"}
	_, err := delta(fresh, 1<<31)
	var gap *versioned.GapError
	require.ErrorAs(t, err, &gap)
	require.Equal(t, int64(0), gap.Stored)
	require.Equal(t, int64(1<<31), gap.Got)
	require.False(t, wmonce.IsPermanent(err), "a gap is retried")

	// Deltas at timestamp versions: seeded, then ms+1 applies, a copy is stale, ms+3 waits.
	acc := versioned.Entity{Type: "account", ID: "ts"}
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, e.v.SetVersion(ctx, tx, acc, ms))
	require.NoError(t, tx.Commit())
	r, err := delta(acc, ms+1)
	require.NoError(t, err)
	require.Equal(t, versioned.Result{Outcome: versioned.Applied, Stored: ms + 1}, r)
	r, err = delta(acc, ms+1)
	require.NoError(t, err)
	require.Equal(t, versioned.Result{Outcome: versioned.Stale, Stored: ms + 1}, r)
	_, err = delta(acc, ms+3)
	require.ErrorAs(t, err, &gap)
	require.Equal(t, ms+1, gap.Stored)

	// Full states at timestamp versions, up to the largest int64.
	doc := versioned.Entity{Type: "profile", ID: "ts"}
	for _, v := range []int64{ms, ms + 10, 1<<63 - 1} {
		r, err := state(doc, v)
		require.NoError(t, err)
		require.Equal(t, versioned.Result{Outcome: versioned.Applied, Stored: v}, r)
	}
	r, err = state(doc, ms+20)
	require.NoError(t, err)
	require.Equal(t, versioned.Result{Outcome: versioned.Stale, Stored: 1<<63 - 1}, r)
	tx, err = e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	cur, err := e.v.Current(ctx, tx, doc)
	require.NoError(t, err)
	require.Equal(t, int64(1<<63-1), cur)
}

// TestImpossibleInputIsPermanent: input no retry can fix (text PostgreSQL cannot hold, a version
// below the first) is a permanent ErrInvalid error, found before any query.
func TestImpossibleInputIsPermanent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	for _, tc := range []struct {
		ent     versioned.Entity
		version int64
		want    string
	}{
		{versioned.Entity{Type: "account", ID: "a\x00b"}, 1, "entity id must not contain NUL"},
		{versioned.Entity{Type: "acc\x00", ID: "a"}, 1, "entity type must not contain NUL"},
		{versioned.Entity{Type: "account", ID: "\xff"}, 1, "entity id must be valid UTF-8"},
		{versioned.Entity{Type: "account", ID: strings.Repeat("x", 1025)}, 1, "at most 1024 bytes"},
		{versioned.Entity{Type: "", ID: "a"}, 1, "entity type is empty"},
		{versioned.Entity{Type: "account", ID: "a"}, 0, "below the first version 1"},
		{versioned.Entity{Type: "account", ID: "a"}, -1 << 63, "below the first version 1"},
	} {
		_, err := e.v.ApplyDelta(ctx, tx, tc.ent, tc.version, nil)
		require.ErrorIs(t, err, versioned.ErrInvalid, "%+v", tc)
		require.True(t, wmonce.IsPermanent(err), "%+v: %v", tc, err)
		require.ErrorContains(t, err, tc.want)
		_, err = e.v.ApplyState(ctx, tx, tc.ent, tc.version, nil)
		require.True(t, wmonce.IsPermanent(err), "%+v: %v", tc, err)
		require.True(t, wmonce.IsPermanent(e.v.SetVersion(ctx, tx, tc.ent, tc.version)), "%+v", tc)
		if tc.version >= 1 {
			_, err = e.v.Current(ctx, tx, tc.ent)
			require.ErrorIs(t, err, versioned.ErrInvalid, "%+v", tc)
			require.True(t, wmonce.IsPermanent(err), "%+v: %v", tc, err)
		}
	}
	// Nothing reached the database: the transaction is still usable.
	_, err = e.v.ApplyDelta(ctx, tx, versioned.Entity{Type: "account", ID: "ok"}, 1, nil)
	require.NoError(t, err)
}
