package once_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/once"
	"github.com/wmonce/watermill-once/oncetype"
	"github.com/wmonce/watermill-once/outbox"
)

func occurred(uuid string, at time.Time, payload string) *message.Message {
	msg := message.NewMessage(uuid, []byte(payload))
	msg.Metadata.Set(outbox.MetadataOccurredAt, at.UTC().Format(time.RFC3339Nano))
	return msg
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
	_, _, err = once.LookupClaim(context.Background(), e.db, e.schema, "c", "e-\x001")
	require.ErrorIs(t, err, oncetype.ErrInvalidKey)
	require.ErrorContains(t, err, "key must not contain NUL bytes")
	_, _, err = once.LookupClaim(context.Background(), e.db, e.schema, "c\xff", "e-1")
	require.ErrorContains(t, err, "consumer must be valid UTF-8")

	daily := newEnv(t, once.Config{Consumer: "c", PartitionByDay: true})
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	_, err = daily.mw.Middleware(daily.effect)(occurred("e-2", at, "p"))
	require.NoError(t, err)
	c, found, err = once.LookupClaim(context.Background(), daily.db, daily.schema, "c", "e-2")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, partition.Day(at), c.OccurredOn.UTC())
}
