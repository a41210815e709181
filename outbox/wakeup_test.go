package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The wake-up protocol alone: rounds are described by what they found (rows, snapshot), no
// database involved. Snapshots are pg_snapshot text, "xmin:xmax:in-progress ids".

const (
	quiet  = "100:100:"       // no transaction in progress
	busy   = "90:100:91,95"   // transactions 91 and 95 in progress
	later  = "95:120:95,110"  // 91 ended; 95 still runs, 110 began after the relay asked
	calm   = "120:120:"       // 95 ended too
	poll   = 10 * time.Second // PollInterval
	listen = true
)

func TestWakeupPublishingRoundReadsAgainAtOnceWithoutAsking(t *testing.T) {
	t.Parallel()
	w := newWakeup(poll)
	require.False(t, w.asks(), "a relay that just started has not found nothing yet")
	require.Equal(t, nextRound{now: true}, w.afterRound(3, quiet, listen))
	require.False(t, w.asks(), "a busy relay costs the Writers no notification")
}

func TestWakeupCaughtUpRelayAsksThenLooksOnceMoreThenWaitsPollInterval(t *testing.T) {
	t.Parallel()
	w := newWakeup(poll)
	require.Equal(t, nextRound{now: true}, w.afterRound(0, quiet, listen), "one more round, that asks")
	require.True(t, w.asks())
	require.Equal(t, nextRound{wait: poll}, w.afterRound(0, quiet, listen), "nothing in progress: wait for a notification")
	require.True(t, w.asks(), "the round after the wait renews the request")
	// A notification, or the poll, ends the wait; the round finds nothing again.
	require.Equal(t, nextRound{wait: poll}, w.afterRound(0, quiet, listen))
	require.True(t, w.asks())
}

// Transactions in progress when the relay asked may have stored without notifying: the relay
// reads again after 2ms, 4ms, ... up to min(PollInterval, 1s), without renewing the request,
// until every one of them ended; transactions that began later are not waited for.
func TestWakeupReadsAgainForTransactionsInProgressWhenItAsked(t *testing.T) {
	t.Parallel()
	w := newWakeup(poll)
	w.afterRound(0, quiet, listen)
	require.True(t, w.asks())
	require.Equal(t, nextRound{wait: 2 * time.Millisecond, recheck: true}, w.afterRound(0, busy, listen), "the round that asked saw 91 and 95")
	require.False(t, w.asks(), "a re-read does not ask again: the request stands")
	require.Equal(t, nextRound{wait: 4 * time.Millisecond, recheck: true}, w.afterRound(0, later, listen), "95 still runs")
	for want := 8 * time.Millisecond; want < time.Second; want *= 2 {
		require.Equal(t, nextRound{wait: want, recheck: true}, w.afterRound(0, later, listen))
	}
	require.Equal(t, nextRound{wait: time.Second, recheck: true}, w.afterRound(0, later, listen), "capped at 1s")
	require.Equal(t, nextRound{wait: time.Second, recheck: true}, w.afterRound(0, later, listen))
	require.Equal(t, nextRound{wait: poll}, w.afterRound(0, calm, listen), "95 ended; 110 began after the request and notifies")
	require.True(t, w.asks(), "settled: the next round renews the request")
}

func TestWakeupRecheckCapIsPollIntervalWhenShorter(t *testing.T) {
	t.Parallel()
	w := newWakeup(5 * time.Millisecond)
	w.afterRound(0, quiet, listen)
	require.Equal(t, nextRound{wait: 2 * time.Millisecond, recheck: true}, w.afterRound(0, busy, listen))
	require.Equal(t, nextRound{wait: 4 * time.Millisecond, recheck: true}, w.afterRound(0, busy, listen))
	require.Equal(t, nextRound{wait: 5 * time.Millisecond, recheck: true}, w.afterRound(0, busy, listen))
}

// A notification that ends a re-read's wait changes nothing: a round that then finds nothing
// goes on with the backoff where it was, and one that publishes starts over.
func TestWakeupRoundAfterANotificationKeepsTheRecheckOrStartsOver(t *testing.T) {
	t.Parallel()
	w := newWakeup(poll)
	w.afterRound(0, quiet, listen)
	w.afterRound(0, busy, listen)
	// Woken by a notification (of a transaction that began later): its round finds nothing.
	require.Equal(t, nextRound{wait: 4 * time.Millisecond, recheck: true}, w.afterRound(0, busy, listen), "not back to 2ms")
	require.False(t, w.asks())
	// Woken by a notification: its round publishes.
	require.Equal(t, nextRound{now: true}, w.afterRound(1, busy, listen))
	require.False(t, w.asks(), "the publishing round withdrew the request")
	require.Equal(t, nextRound{now: true}, w.afterRound(0, busy, listen), "caught up again: ask first")
	require.True(t, w.asks())
	require.Equal(t, nextRound{wait: 2 * time.Millisecond, recheck: true}, w.afterRound(0, busy, listen), "the new request's re-reads start at 2ms")
}

// Without LISTEN nothing wakes the relay: an empty round waits PollInterval and never asks.
func TestWakeupWithoutListenPollsAndNeverAsks(t *testing.T) {
	t.Parallel()
	w := newWakeup(poll)
	for range 3 {
		require.Equal(t, nextRound{wait: poll}, w.afterRound(0, busy, !listen))
		require.False(t, w.asks())
	}
	require.Equal(t, nextRound{now: true}, w.afterRound(2, busy, !listen), "a round that published reads again at once")
}

func TestInProgressParsesTheSnapshotText(t *testing.T) {
	t.Parallel()
	require.Nil(t, inProgress("100:100:"))
	require.Nil(t, inProgress("garbage"))
	require.Equal(t, []string{"91", "95"}, inProgress("90:100:91,95"))
	require.Equal(t, []string{"95"}, stillInProgress([]string{"91", "95"}, "95:120:95,110"))
	require.Empty(t, stillInProgress([]string{"91", "95"}, "120:120:"))
}
