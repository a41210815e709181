package operate

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// The one table decides both what a listed group offers and what an action on it accepts: for
// every kind and action, ActOnFailureGroup's checks accept exactly the offered actions, and
// refuse the others with an input error (the API's 400, the CLI's exit 2) that says what the
// kind takes instead.
func TestAFailureGroupTakesExactlyTheActionsItOffers(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{FailureKindInbox, FailureKindParked, FailureKindRejected} {
		offered := groupActions(kind, "payments")
		require.NotEmpty(t, offered, kind)
		for _, action := range []string{ActionReplay, ActionSkip, ActionDiscard, "purge"} {
			req := FailureActionRequest{Kind: kind, Fingerprint: "0123456789abcdef", Action: action}
			if action == ActionSkip {
				req.Reason = "refunded by hand"
			}
			run, err := checkFailureAction(req)
			if slices.Contains(offered, action) {
				require.NoError(t, err, "%s %s", kind, action)
				require.NotNil(t, run)
				continue
			}
			require.Error(t, err, "%s %s", kind, action)
			require.True(t, IsInputError(err), "%s %s: %v", kind, action, err)
		}
	}
	require.Equal(t, []string{ActionDiscard}, groupActions(FailureKindRejected, ""), "undecodable rows are only discarded")
	_, err := checkFailureAction(FailureActionRequest{Kind: "outbox", Fingerprint: "0123456789abcdef", Action: ActionReplay})
	require.ErrorContains(t, err, `kind "outbox": use inbox, parked or rejected`)
	_, err = checkFailureAction(FailureActionRequest{Kind: FailureKindInbox, Fingerprint: "0123456789abcdef", Action: ActionSkip})
	require.ErrorContains(t, err, "reason is required")
}
