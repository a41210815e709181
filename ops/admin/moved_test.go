package admin_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/pgtx"
)

// A relay position recorded on another cluster (a restore into a cluster whose counter is
// lower, simulated by a snapshot far ahead of this one) is in the outbox API with what to run,
// and gone once rebased.
func TestOutboxAPIShowsAMovedPosition(t *testing.T) {
	t.Parallel()
	f := admintest.New(t, 0)
	srv := f.Server(t, admin.Config{})
	api := srv.URL + "/api/"
	var ob operate.OutboxStats
	get(t, api+"outbox").decode(t, &ob)
	require.False(t, ob.Relays[0].Moved)
	require.Empty(t, ob.Relays[0].Finding)

	pgtest.Exec(t, f.DB, `UPDATE `+pgtx.QualifiedName(f.Schema, "outbox_offsets")+` SET snapshot =
    ((pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 10000000)::text || ':' || (pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 10000000)::text || ':')::pg_snapshot`)
	get(t, api+"outbox").decode(t, &ob)
	require.True(t, ob.Relays[0].Moved)
	require.Contains(t, ob.Relays[0].Finding, `position "sms" was recorded on another cluster`)
	require.Contains(t, ob.Relays[0].Finding, "wmonce -schema "+f.Schema+" rebase")

	_, err := outboxops.RebasePositions(context.Background(), f.DB, f.Schema)
	require.NoError(t, err)
	get(t, api+"outbox").decode(t, &ob)
	require.False(t, ob.Relays[0].Moved)
}
