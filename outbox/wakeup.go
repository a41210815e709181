package outbox

import (
	"slices"
	"strings"
	"time"
)

// firstRecheck is the first wait before reading again for transactions that were in progress
// when the relay asked for notifications: about one commit.
const firstRecheck = 2 * time.Millisecond

// wakeup is the wake-up protocol of a leading relay (docs/outbox-relay.md, When the relay wakes). From what each
// round found it decides whether the next round asks the Writers to notify the relay, and
// whether the relay reads again at once or first waits for a notification, and how long. It
// holds no connection and reads no clock: the lead loop runs the rounds, tells afterRound what
// they found, and waits. Whatever ends a wait (a notification, LISTEN re-established, the
// wait's timer, a held topic due) changes nothing here: the loop runs the next round.
//
// The request stands while the relay waits; a round that publishes withdraws it (in its
// position update, relayQueries.advance), so that producers do not pay for notifications while
// the relay is busy: a notifying transaction takes, at commit, a lock that serialises the
// commits of all notifying transactions on the server.
type wakeup struct {
	pollInterval time.Duration
	// asking: the previous round found nothing, so the next asks the Writers to notify (and
	// looks once more, for what committed before they were asked).
	asking bool
	// asked: the round that asked has run. A Writer decides whether to notify when it stores,
	// so a transaction that stored before the request and commits after that round sends
	// nothing. Such transactions were in progress at that round's snapshot: waitFor holds
	// them, and the relay reads again after recheck, doubling up to maxRecheck, until none of
	// them is still in progress.
	asked   bool
	waitFor []string
	recheck time.Duration // 0: no re-read pending
}

// nextRound is what the relay does after a round.
type nextRound struct {
	now     bool          // read again at once
	wait    time.Duration // otherwise: wait this long for a notification, then read again
	recheck bool          // the wait is a re-read for transactions in progress (RelayCounters.Rechecks)
}

func newWakeup(pollInterval time.Duration) wakeup { return wakeup{pollInterval: pollInterval} }

// asks reports whether the next round asks the Writers to notify (and renews the request). The
// re-reads for transactions in progress do not: the request they follow still stands.
func (w *wakeup) asks() bool { return w.asking && w.recheck == 0 }

// afterRound takes what a round did: n rows published, held, rejected or passed over (held
// rows drained included), at snapshot snap (pg_snapshot text), and listening, whether a commit
// after the snapshot wakes the relay (LISTEN on, with a pgx driver).
func (w *wakeup) afterRound(n int, snap string, listening bool) nextRound {
	switch {
	case n > 0:
		// More may be waiting, and the request (if any) was withdrawn.
		*w = newWakeup(w.pollInterval)
		return nextRound{now: true}
	case !listening:
		return nextRound{wait: w.pollInterval}
	case !w.asking:
		// Caught up: one more round asks the Writers to notify and looks once more.
		w.asking = true
		return nextRound{now: true}
	case !w.asked: // the round that asked
		w.asked, w.waitFor, w.recheck = true, inProgress(snap), firstRecheck
	case w.recheck > 0:
		w.waitFor, w.recheck = stillInProgress(w.waitFor, snap), min(2*w.recheck, w.maxRecheck())
	}
	if len(w.waitFor) == 0 {
		w.recheck = 0
		return nextRound{wait: w.pollInterval}
	}
	return nextRound{wait: w.recheck, recheck: true}
}

// maxRecheck caps the re-reads' backoff: PollInterval, or 1s if that is longer, so that a
// long transaction elsewhere on the server costs at most two statements a second.
func (w *wakeup) maxRecheck() time.Duration { return min(w.pollInterval, time.Second) }

// idleTTL is how long a relay's request for notifications lasts (outbox_offsets.idle_until):
// an idle relay renews it at least every PollInterval, and a relay that stopped or got busy
// stops costing the Writers notifications once it lapses.
func idleTTL(pollInterval time.Duration) time.Duration { return 2*pollInterval + time.Second }

// inProgress returns the in-progress transaction ids of a pg_snapshot's text form
// ("xmin:xmax:xip,xip,...").
func inProgress(snap string) []string {
	i := strings.LastIndexByte(snap, ':')
	if i < 0 || i == len(snap)-1 {
		return nil
	}
	return strings.Split(snap[i+1:], ",")
}

// stillInProgress returns the ids of ids that are in progress in snap.
func stillInProgress(ids []string, snap string) []string {
	now := inProgress(snap)
	var out []string
	for _, id := range ids {
		if slices.Contains(now, id) {
			out = append(out, id)
		}
	}
	return out
}
