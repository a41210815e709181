package owner_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/owner"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// CheckPrune refuses each malformed request with the error naming what to fix, and returns the
// cutoff of a good one: Before as given, or now() - Keep by the database's clock.
func TestCheckPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.DB(t)
	before := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		schema  string
		req     pgtx.PruneRequest
		scope   owner.PruneScope
		wantErr []string
	}{
		{name: "before", req: pgtx.PruneRequest{Before: before}},
		{name: "keep", req: pgtx.PruneRequest{Keep: time.Hour}},
		{name: "neither", req: pgtx.PruneRequest{}, wantErr: []string{"set Before (a time) or Keep (an age)"}},
		{name: "both", req: pgtx.PruneRequest{Before: before, Keep: time.Hour}, wantErr: []string{"set Before or Keep, not both"}},
		{name: "negative keep", req: pgtx.PruneRequest{Keep: -time.Hour}, wantErr: []string{"keep must not be negative, got -1h0m0s"}},
		{name: "negative batch", req: pgtx.PruneRequest{Keep: time.Hour, BatchSize: -1}, wantErr: []string{"BatchSize must be positive, got -1"}},
		{name: "bad schema and consumer", schema: `bad"name`, req: pgtx.PruneRequest{Keep: time.Hour, Consumer: "a"}, wantErr: []string{"schema", `Consumer "a" given, but these rows belong to no consumer`}},
		{name: "per consumer without one", req: pgtx.PruneRequest{Keep: time.Hour}, scope: owner.PerConsumer, wantErr: []string{"Consumer is required"}},
		{name: "per consumer", req: pgtx.PruneRequest{Keep: time.Hour, Consumer: "a"}, scope: owner.PerConsumer},
		{name: "any consumer, every one", req: pgtx.PruneRequest{Keep: time.Hour}, scope: owner.AnyConsumer},
		{name: "any consumer, one", req: pgtx.PruneRequest{Keep: time.Hour, Consumer: "a"}, scope: owner.AnyConsumer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schema, req, cutoff, err := owner.CheckPrune(ctx, db, tc.schema, tc.req, tc.scope)
			if len(tc.wantErr) > 0 {
				for _, want := range tc.wantErr {
					require.ErrorContains(t, err, want)
				}
				return
			}
			require.NoError(t, err)
			require.Equal(t, pgtx.DefaultSchema, schema)
			require.Equal(t, 1000, req.BatchSize, "the default batch size")
			if !tc.req.Before.IsZero() {
				require.Equal(t, before, cutoff)
				return
			}
			require.WithinDuration(t, time.Now().Add(-tc.req.Keep), cutoff, time.Minute, "now() - Keep")
		})
	}
	_, _, _, err := owner.CheckPrune(ctx, nil, "", pgtx.PruneRequest{Keep: time.Hour}, owner.Unscoped)
	require.ErrorContains(t, err, "db is nil")
}
