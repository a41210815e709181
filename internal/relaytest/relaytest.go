// Package relaytest drives an outbox relay from tests that need its rows forwarded (admin, the
// CLI, metrics, retention): one helper instead of a copy in each package's tests.
package relaytest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/outbox"
)

// RunUntil runs relay rounds until done holds for the relay's counters. Rows committed before a
// round are read by it, so each round makes progress until done holds; maxIdle rounds in a row
// that find nothing mean it never will, and fail t (2 where the first round may only close the
// previous one, 1 where no earlier round is open).
func RunUntil(t testing.TB, relay *outbox.Relay, what string, maxIdle int, done func(outbox.RelayCounters) bool) {
	t.Helper()
	idle := 0
	for !done(relay.Counters()) {
		n, err := relay.RelayOnce(context.Background())
		require.NoError(t, err)
		if n > 0 {
			idle = 0
		} else if idle++; idle >= maxIdle {
			t.Fatalf("the relay found nothing more and did not %s: %+v", what, relay.Counters())
		}
	}
}
