package operate_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/operate"
)

// The one rule of which inbox rows an operator may change, as the inbox applies it
// (Ops.Replay, Ops.Skip) and the CLI and the admin page check it (operate.CheckChange): never
// IN_PROGRESS; replay FAILED, PENDING, DONE or SKIPPED; skip FAILED or PENDING. The CLI's and
// the page's tests only check that they surface it.
func TestCheckChangeIsTheInboxRule(t *testing.T) {
	t.Parallel()
	allowed := map[string][]inbox.Status{
		"replay": {inbox.StatusFailed, inbox.StatusPending, inbox.StatusDone, inbox.StatusSkipped},
		"skip":   {inbox.StatusFailed, inbox.StatusPending},
	}
	all := []inbox.Status{inbox.StatusPending, inbox.StatusInProgress, inbox.StatusDone, inbox.StatusFailed, inbox.StatusSkipped}
	for op, ok := range allowed {
		require.NoError(t, operate.CheckChange(op, inbox.Filter{Consumer: "c"}), "%s of the default (FAILED) rows", op)
		for _, s := range all {
			err := operate.CheckChange(op, inbox.Filter{Consumer: "c", Statuses: []inbox.Status{inbox.StatusFailed, s}})
			switch {
			case s == inbox.StatusInProgress:
				require.ErrorContains(t, err, "IN_PROGRESS rows belong to a worker", op)
			case slices.Contains(ok, s):
				require.NoError(t, err, "%s %s", op, s)
			default:
				require.ErrorContains(t, err, "status "+string(s)+" cannot be changed by "+op, op)
			}
			if err != nil {
				require.True(t, operate.IsInputError(err), "%s %s: a usage error and a 400", op, s)
			}
		}
	}
}
