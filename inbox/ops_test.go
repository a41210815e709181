package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/inboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

func TestOpsInspectListAndStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c", OrderingKey: orderByMetadataKey})
	other := e.receiver(t, inbox.ReceiverConfig{Consumer: "other"})
	for i := range 5 {
		require.NoError(t, r.Handle(msg(fmt.Sprintf("e-%d", i), fmt.Sprintf("p%d", i), "key", "K", "seq", fmt.Sprint(i))))
	}
	require.NoError(t, other.Handle(msg("o-1", "x")))

	row, err := e.ops.InspectMessage(ctx, "c", "e-2")
	require.NoError(t, err)
	require.Equal(t, "e-2", row.MessageUUID)
	require.Equal(t, "K", row.OrderingKey)
	require.Equal(t, []byte("p2"), row.Payload)
	require.Equal(t, map[string]string{"key": "K", "seq": "2"}, row.Metadata)
	require.Equal(t, inbox.StatusPending, row.Status)
	require.Zero(t, row.Attempts)
	require.True(t, row.LeaseUntil.IsZero())
	same, err := e.ops.Inspect(ctx, row.ID)
	require.NoError(t, err)
	require.Equal(t, row, same)
	_, err = e.ops.Inspect(ctx, row.ID+1000)
	require.ErrorIs(t, err, inbox.ErrNotFound)
	_, err = e.ops.InspectMessage(ctx, "c", "nope")
	require.ErrorIs(t, err, inbox.ErrNotFound)

	// Paging in received order.
	page, err := e.ops.List(ctx, inbox.Filter{Consumer: "c"}, 2)
	require.NoError(t, err)
	require.Len(t, page, 2)
	require.Equal(t, "e-0", page[0].MessageID)
	page, err = e.ops.List(ctx, inbox.Filter{Consumer: "c", AfterID: page[1].ID}, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"e-2", "e-3", "e-4"}, messageIDs(page))
	page, err = e.ops.List(ctx, inbox.Filter{Consumer: "c", MessageIDs: []string{"e-4", "e-1"}}, 10)
	require.NoError(t, err)
	require.Equal(t, []string{"e-1", "e-4"}, messageIDs(page))
	_, err = e.ops.List(ctx, inbox.Filter{Consumer: "c", Statuses: []inbox.Status{"LOST"}}, 10)
	require.ErrorContains(t, err, `unknown status "LOST"`)
	_, err = e.ops.List(ctx, inbox.Filter{}, 10)
	require.ErrorContains(t, err, "Consumer is blank")

	all, err := e.ops.AllStats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), all["c"].Pending)
	require.Equal(t, int64(1), all["other"].Pending)
	require.False(t, all["c"].OldestPendingReceivedAt.IsZero())
	require.GreaterOrEqual(t, all["c"].OldestPendingAge, time.Duration(0))
}

func messageIDs(rows []inbox.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.MessageID
	}
	return out
}

// Skipping a parked row lets its key move on; the skipped row stays as a dedupe record with
// the reason.
func TestOpsSkipKeyLetsTheKeyMoveOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c", OrderingKey: orderByMetadataKey})
	cfg := fast("c")
	cfg.MaxAttempts = 1
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if string(m.Payload) == "poison" {
			return nil, errors.New("bad payload")
		}
		return nil, e.effect(m, "w")
	}, cfg)
	require.NoError(t, r.Handle(msg("a1", "poison", "key", "A", "seq", "1")))
	require.NoError(t, r.Handle(msg("a2", "ok", "key", "A", "seq", "2")))
	p.until(t, "parking", func(n tally) bool { return n.Parked == 1 })

	_, err := e.ops.Skip(ctx, inbox.Filter{Consumer: "c", OrderingKey: "A"}, " ", false)
	require.ErrorContains(t, err, "give a reason")
	n, err := e.ops.Skip(ctx, inbox.Filter{Consumer: "c", OrderingKey: "A"}, "x", true)
	require.NoError(t, err)
	require.Equal(t, 1, n, "dry run")
	n, err = e.ops.SkipKey(ctx, "c", "A", "payload from a broken producer, ticket 4411")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	p.until(t, "the rest of key A", func(n tally) bool { return n.Done == 1 })
	require.Equal(t, []int{2}, seqsOf(t, e, "A"))

	row, err := e.ops.InspectMessage(ctx, "c", "a1")
	require.NoError(t, err)
	require.Equal(t, inbox.StatusSkipped, row.Status)
	require.Equal(t, "skipped: payload from a broken producer, ticket 4411; last error: bad payload", row.LastError)
	require.False(t, row.FinishedAt.IsZero())
	require.NoError(t, r.Handle(msg("a1", "poison", "key", "A", "seq", "1")), "a copy of a skipped message is acked")
	require.Equal(t, uint64(1), r.Counters().Duplicates)
}

func TestOpsRefuseToTouchClaimedRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	in := []inbox.Status{inbox.StatusInProgress}
	_, err := e.ops.Replay(ctx, inbox.Filter{Consumer: "c", Statuses: in}, false)
	require.ErrorContains(t, err, "belong to a worker")
	_, err = e.ops.Skip(ctx, inbox.Filter{Consumer: "c", Statuses: in}, "r", false)
	require.ErrorContains(t, err, "belong to a worker")
	_, err = e.ops.Skip(ctx, inbox.Filter{Consumer: "c", Statuses: []inbox.Status{inbox.StatusDone}}, "r", false)
	require.ErrorContains(t, err, "cannot be changed")
	_, err = e.ops.SkipKey(ctx, "c", "", "r")
	require.ErrorContains(t, err, "ordering key is empty")
	_, err = e.ops.Replay(ctx, inbox.Filter{}, true)
	require.ErrorContains(t, err, "Consumer is blank")
}

// PruneFinished removes only finished rows older than the cutoff; a deleted row no longer
// deduplicates, which is why retention must outlast redelivery.
func TestOpsDeleteFinished(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	for i := range 5 {
		require.NoError(t, r.Handle(msg(fmt.Sprintf("e-%d", i), "x")))
	}
	pgtest.Exec(t, e.db, `UPDATE `+e.table("inbox")+` SET status = 'DONE', finished_at = now() - interval '2 days' WHERE message_id IN ('e-0', 'e-1', 'e-2')`)
	pgtest.Exec(t, e.db, `UPDATE `+e.table("inbox")+` SET status = 'DONE', finished_at = now() WHERE message_id = 'e-3'`)

	_, err := inbox.PruneFinished(ctx, e.db, e.schema, pgtx.PruneRequest{Consumer: "c", BatchSize: 10})
	require.ErrorContains(t, err, "set Before (a time) or Keep")
	// In batches of two: the three old rows go in two statements.
	n, err := inbox.PruneFinished(ctx, e.db, e.schema, pgtx.PruneRequest{Consumer: "c", Keep: 24 * time.Hour, BatchSize: 2})
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	n, err = inbox.PruneFinished(ctx, e.db, e.schema, pgtx.PruneRequest{Before: time.Now().Add(-24 * time.Hour)})
	require.NoError(t, err)
	require.Zero(t, n, "every consumer: nothing else is old enough")
	require.Equal(t, []string{"e-3", "e-4"}, func() []string {
		rows, err := e.ops.List(ctx, inbox.Filter{Consumer: "c"}, 10)
		require.NoError(t, err)
		return messageIDs(rows)
	}())
}

func TestOpsConsumersAndFinishedStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	consumers, err := e.ops.Consumers(ctx)
	require.NoError(t, err)
	require.Empty(t, consumers)
	for _, c := range []string{"b", "a", "c"} {
		r := e.receiver(t, inbox.ReceiverConfig{Consumer: c})
		for i := range 3 {
			require.NoError(t, r.Handle(msg(fmt.Sprintf("%s-%d", c, i), "x")))
		}
	}
	pgtest.Exec(t, e.db, `UPDATE `+e.table("inbox")+` SET status = 'DONE', finished_at = now() WHERE message_id IN ('a-0', 'a-1', 'b-0')`)
	pgtest.Exec(t, e.db, `UPDATE `+e.table("inbox")+` SET status = 'SKIPPED', finished_at = now() WHERE message_id = 'a-2'`)

	consumers, err = e.ops.Consumers(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, consumers)
	finished, err := inboxops.CountFinished(ctx, e.ops)
	require.NoError(t, err)
	require.Equal(t, map[string]inboxops.FinishedStats{"a": {Done: 2, Skipped: 1}, "b": {Done: 1}}, finished,
		"c has no finished row")
}
