package pgtx_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/effects/versioned"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

func TestIsNil(t *testing.T) {
	t.Parallel()
	var tx *sql.Tx //nolint:staticcheck // SA4023, see below
	var execer interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	} = tx
	require.True(t, execer != nil, //nolint:staticcheck // SA4023: always true, which is the trap this test shows
		"the trap: an interface holding a nil pointer is not nil")
	require.True(t, pgtx.IsNil(execer))
	require.True(t, pgtx.IsNil(nil))
	require.False(t, pgtx.IsNil(pgtest.DB(t)))
	require.False(t, pgtx.IsNil(0))
}

// `tx, _ := pgtx.TxFromContext(ctx)` outside a transaction yields a nil *sql.Tx. Every exported
// function that takes an executor (or a *sql.DB) must return an error for it, not panic inside
// database/sql. Constructors already refuse a nil *sql.DB; these are the rest.
func TestExecutorTakingFunctionsRefuseNil(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	tx, ok := pgtx.TxFromContext(ctx)
	require.False(t, ok)
	require.Nil(t, tx)
	var nilDB *sql.DB

	require.ErrorContains(t, pgtx.RunInTx(ctx, nilDB, nil, pgtx.RetryPolicy{}, func(context.Context, *sql.Tx) error { return nil }), "db is nil")

	store, err := intent.NewStore(db, intent.StoreConfig{})
	require.NoError(t, err)
	_, err = store.RecordTx(ctx, tx, intent.Draft{Channel: "sms", Consumer: "c", EventID: "e"})
	require.ErrorIs(t, err, pgtx.ErrNoTransaction)

	receiver, err := inbox.NewReceiver(db, inbox.ReceiverConfig{Consumer: "c"}, nil)
	require.NoError(t, err)
	_, err = receiver.StoreTx(ctx, tx, "topic", message.NewMessage("u", nil))
	require.ErrorIs(t, err, pgtx.ErrNoTransaction)
	require.ErrorContains(t, err, "tx is nil")

	versions, err := versioned.New(versioned.Config{})
	require.NoError(t, err)
	entity := versioned.Entity{Type: "order", ID: "1"}
	_, err = versions.Current(ctx, tx, entity)
	require.ErrorIs(t, err, pgtx.ErrNoTransaction)
	require.ErrorContains(t, err, "tx is nil")
	require.ErrorIs(t, versions.SetVersion(ctx, tx, entity, 1), pgtx.ErrNoTransaction)
	_, err = versions.ApplyState(ctx, tx, entity, 1, func(context.Context) error { return nil })
	require.ErrorIs(t, err, pgtx.ErrNoTransaction)

	_, _, err = once.LookupClaim(ctx, nil, "wmonce", "c", "k")
	require.ErrorContains(t, err, "db is nil")
	_, err = outbox.ForgetRelay(ctx, nil, "wmonce", "r")
	require.ErrorContains(t, err, "db is nil")
	_, err = outbox.Prune(ctx, nil, "wmonce", pgtx.PruneRequest{Keep: time.Hour, BatchSize: 1})
	require.ErrorContains(t, err, "db is nil")
	_, err = once.Stats(ctx, nil, "wmonce")
	require.ErrorContains(t, err, "db is nil")
	_, err = httpidem.Prune(ctx, nil, "wmonce", pgtx.PruneRequest{Keep: time.Hour, BatchSize: 1})
	require.ErrorContains(t, err, "db is nil")
	_, err = retention.Purge(ctx, nil, "wmonce", retention.PurgeRequest{Before: time.Now()})
	require.ErrorContains(t, err, "db is nil")
	_, err = operate.ReadConsumers(ctx, nil, "wmonce", nil)
	require.ErrorContains(t, err, "db is nil")
}
