package once_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/once"
	"github.com/wmonce/watermill-once/oncetype"
	"github.com/wmonce/watermill-once/outbox"
)

func occurred(uuid string, at time.Time, payload string) *message.Message {
	msg := message.NewMessage(uuid, []byte(payload))
	msg.Metadata.Set(outbox.MetadataOccurredAt, at.UTC().Format(time.RFC3339Nano))
	return msg
}

func TestAgeGuardRefusesOldFreshCopiesOnly(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	e := newEnv(t, once.Config{Consumer: "c", MaxMessageAge: 24 * time.Hour, Now: func() time.Time { return now }})
	h := e.mw.Middleware(e.effect)

	// Applied while young; a late copy of it is an ordinary duplicate, acked.
	_, err := h(occurred("e-1", now.Add(-time.Hour), "p"))
	require.NoError(t, err)
	now = now.Add(48 * time.Hour)
	_, err = h(occurred("e-1", now.Add(-49*time.Hour), "p"))
	require.NoError(t, err)

	// An old event whose key is unknown may have been applied and forgotten: refused, reported.
	_, err = h(occurred("e-2", now.Add(-30*time.Hour), "p"))
	require.ErrorIs(t, err, oncetype.ErrTooOld)
	require.True(t, oncetype.IsPermanent(err))
	require.Equal(t, 1, e.effects(t))
	require.Equal(t, 1, e.claims(t), "the refused copy left no claim")
	c := e.mw.Counters("c")
	require.Equal(t, uint64(1), c.TooOld)
	require.Equal(t, uint64(1), c.Duplicates)

	// Without a time the guard cannot judge and lets the message through.
	_, err = h(message.NewMessage("e-3", []byte("p")))
	require.NoError(t, err)

	// A time that does not parse is malformed metadata: refused, not guessed.
	bad := message.NewMessage("e-4", []byte("p"))
	bad.Metadata.Set(outbox.MetadataOccurredAt, "yesterday")
	_, err = h(bad)
	require.ErrorIs(t, err, oncetype.ErrMalformedMetadata)
	require.True(t, oncetype.IsPermanent(err))
	require.Equal(t, 2, e.effects(t))
}

func TestCountsPerSender(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c", SenderMetadataKey: "sender"})
	h := e.mw.Middleware(e.effect)
	send := func(uuid, sender string) {
		msg := message.NewMessage(uuid, []byte("p"))
		msg.Metadata.Set("sender", sender)
		_, err := h(msg)
		require.NoError(t, err)
	}
	send("a", "payments")
	send("a", "payments")
	send("a", "redrive-tool")
	send("b", "redrive-tool")
	by := e.mw.CountersBySender()
	require.Equal(t, once.Counters{Fresh: 1, Duplicates: 1}, by[once.CounterKey{Consumer: "c", Sender: "payments"}])
	require.Equal(t, once.Counters{Fresh: 1, Duplicates: 1}, by[once.CounterKey{Consumer: "c", Sender: "redrive-tool"}])
	require.Equal(t, once.Counters{Fresh: 2, Duplicates: 2}, e.mw.Counters("c"))
}

func TestPartitionByDay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c", PartitionByDay: true})
	h := e.mw.Middleware(e.effect)
	day1 := time.Date(2026, 11, 20, 23, 59, 0, 0, time.UTC)
	day2 := day1.Add(2 * time.Minute) // next day

	// Partitions are created on demand; copies meet their original in the same partition.
	for range 3 {
		_, err := h(occurred("e-1", day1, "p"))
		require.NoError(t, err)
	}
	_, err := h(occurred("e-2", day2, "p"))
	require.NoError(t, err)
	require.Equal(t, 2, e.effects(t))
	require.Equal(t, once.Counters{Fresh: 2, Duplicates: 2}, e.mw.Counters("c"))
	days, err := partition.List(context.Background(), e.db, e.schema)
	require.NoError(t, err)
	require.Equal(t, []time.Time{partition.Day(day1), partition.Day(day2)}, days)
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table(partition.Name(day1))))

	// A message without a time cannot be placed: refused, never applied.
	_, err = h(message.NewMessage("e-3", []byte("p")))
	require.ErrorIs(t, err, oncetype.ErrMalformedMetadata)
	require.Equal(t, 2, e.effects(t))

	// Retention drops whole days.
	dropped, err := partition.DropBefore(context.Background(), e.db, e.schema, day2)
	require.NoError(t, err)
	require.Equal(t, []time.Time{partition.Day(day1)}, dropped)
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table(partition.Parent)))
}

func TestLookupClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c"})
	_, err := e.mw.Middleware(e.effect)(message.NewMessage("e-1", []byte("p")))
	require.NoError(t, err)
	c, found, err := once.LookupClaim(context.Background(), e.db, e.schema, "c", "e-1")
	require.NoError(t, err)
	require.True(t, found)
	require.Len(t, c.PayloadSHA256, 32)
	require.WithinDuration(t, time.Now(), c.ProcessedAt, time.Minute)
	_, found, err = once.LookupClaim(context.Background(), e.db, e.schema, "other", "e-1")
	require.NoError(t, err)
	require.False(t, found)

	daily := newEnv(t, once.Config{Consumer: "c", PartitionByDay: true})
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	_, err = daily.mw.Middleware(daily.effect)(occurred("e-2", at, "p"))
	require.NoError(t, err)
	c, found, err = once.LookupClaim(context.Background(), daily.db, daily.schema, "c", "e-2")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, partition.Day(at), c.OccurredOn.UTC())
}
