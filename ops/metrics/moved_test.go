package metrics_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/metrics"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// A relay position recorded on another cluster (a restore into a cluster with a lower counter,
// simulated by a snapshot far ahead of this one) is exported as 1, and 0 once rebased.
func TestMetricsOfAMovedPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	r, err := outbox.NewRelay(db, failingBroker{}, outbox.RelayConfig{Schema: schema, Name: "kafka"}, nil)
	require.NoError(t, err)
	_, err = r.RelayOnce(ctx)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{DB: db, Schema: schema}))
	require.Equal(t, 0.0, value(t, reg, "wmonce_outbox_position_moved", map[string]string{"relay": "kafka"}))

	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "outbox_offsets")+` SET snapshot =
    ((pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 10000000)::text || ':' || (pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 10000000)::text || ':')::pg_snapshot`)
	require.Equal(t, 1.0, value(t, reg, "wmonce_outbox_position_moved", map[string]string{"relay": "kafka"}))

	_, err = outboxops.RebasePositions(ctx, db, schema)
	require.NoError(t, err)
	require.Equal(t, 0.0, value(t, reg, "wmonce_outbox_position_moved", map[string]string{"relay": "kafka"}))
}
