package metrics_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/metrics"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// A paused relay and a paused inbox consumer are exported as 1 (0 once resumed), read from the
// database, and a relay's delayed rows as a gauge of their own, apart from its backlog.
func TestMetricsOfPausesAndDelayedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return w.PublishTxAt(ctx, tx, time.Now().Add(time.Hour), "orders", message.NewMessage("later", nil))
	}))
	r, err := outbox.NewRelay(db, failingBroker{}, outbox.RelayConfig{Schema: schema, Name: "kafka"}, nil)
	require.NoError(t, err)
	_, err = r.RelayOnce(ctx)
	require.NoError(t, err)
	_, err = outbox.PauseRelay(ctx, db, schema, "kafka")
	require.NoError(t, err)
	ops, err := inbox.NewOps(db, inbox.OpsConfig{Schema: schema}, nil)
	require.NoError(t, err)
	_, err = ops.Pause(ctx, "billing")
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{DB: db, Schema: schema, Relays: []*outbox.Relay{r}}))
	require.Equal(t, 1.0, value(t, reg, "wmonce_outbox_delayed_rows", map[string]string{"relay": "kafka"}))
	require.Equal(t, 0.0, value(t, reg, "wmonce_outbox_backlog", map[string]string{"relay": "kafka"}))
	require.Equal(t, 1.0, value(t, reg, "wmonce_outbox_paused", map[string]string{"relay": "kafka"}))
	require.Equal(t, 1.0, value(t, reg, "wmonce_inbox_paused", map[string]string{"consumer": "billing"}))

	_, err = outbox.ResumeRelay(ctx, db, schema, "kafka")
	require.NoError(t, err)
	_, err = ops.Resume(ctx, "billing")
	require.NoError(t, err)
	require.Equal(t, 0.0, value(t, reg, "wmonce_outbox_paused", map[string]string{"relay": "kafka"}))
	require.Equal(t, 0.0, value(t, reg, "wmonce_inbox_paused", map[string]string{"consumer": "billing"}), "a consumer seen before reports 0")
}
