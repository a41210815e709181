package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// park stores msg as Watermill's poison queue does through ParkingPublisher: with the reason,
// the consumed topic and the handler in its metadata.
func park(t *testing.T, db *sql.DB, w *outbox.Writer, msg *message.Message, topic, handler, reason string) {
	t.Helper()
	msg.Metadata.Set(middleware.ReasonForPoisonedKey, reason)
	msg.Metadata.Set(middleware.PoisonedTopicKey, topic)
	msg.Metadata.Set(middleware.PoisonedHandlerKey, handler)
	msg.Metadata.Set(middleware.PoisonedSubscriberKey, "sub")
	require.NoError(t, w.ParkingPublisher(db).Publish("poison", msg))
}

// Parked messages are grouped by handler, consumed topic and reason; a replay stores the
// originals again for the topic they came from (UUID, payload and metadata as the consumer
// got them, without the poison queue's keys), once; a discard sets a group aside.
func TestParkedGroupsReplayAndDiscard(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	for i := range 3 {
		m := message.NewMessage(fmt.Sprintf("order-%d", i), []byte(fmt.Sprintf(`{"order":%d}`, i)))
		m.Metadata.Set("tenant", "acme")
		park(t, db, w, m, "orders", "billing", fmt.Sprintf("order %d not found at 10.0.0.%d:5432", 100+i, i))
	}
	park(t, db, w, message.NewMessage("bad-1", []byte("{")), "orders", "billing", "payload is not JSON")
	publishTx(t, db, w, "orders", "plain-1") // not parked

	groups, left, err := outboxops.ParkedGroups(ctx, db, schema, 0)
	require.NoError(t, err)
	require.Zero(t, left)
	require.Len(t, groups, 2, "%+v", groups)
	notFound, bad := groups[0], groups[1]
	require.Equal(t, outboxops.ParkedGroup{
		Fingerprint: notFound.Fingerprint, Handler: "billing", Topic: "orders", Pattern: "order <n> not found at <addr>",
		Example: "order 102 not found at 10.0.0.2:5432", Rows: 3, FirstSeen: notFound.FirstSeen, LastSeen: notFound.LastSeen,
	}, notFound)
	require.Equal(t, int64(1), bad.Rows)

	dry, err := outboxops.ReplayParkedGroup(ctx, db, schema, outboxops.ParkedGroupRequest{Fingerprint: notFound.Fingerprint, DryRun: true})
	require.NoError(t, err)
	require.Len(t, dry.Offsets, 3)
	outboxRows := func() int { return pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")) }
	require.Equal(t, 5, outboxRows(), "a dry run stores nothing")
	done, err := outboxops.ReplayParkedGroup(ctx, db, schema, outboxops.ParkedGroupRequest{Fingerprint: notFound.Fingerprint, Offsets: dry.Offsets[:2]})
	require.NoError(t, err)
	require.Equal(t, dry.Offsets[:2], done.Offsets)
	require.Equal(t, 7, outboxRows())

	var got []*message.Message
	s := &sink{failOn: func(topic string, msgs []*message.Message) error {
		if topic == "orders" {
			got = append(got, msgs...)
		}
		return nil
	}}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	drain(t, r, s, 7)
	require.Equal(t, []string{"poison/order-0", "poison/order-1", "poison/order-2", "poison/bad-1", "orders/plain-1", "orders/order-0", "orders/order-1"}, s.all())
	replayed := got[len(got)-2]
	require.Equal(t, "order-0", replayed.UUID)
	require.JSONEq(t, `{"order":0}`, string(replayed.Payload))
	require.Equal(t, "acme", replayed.Metadata.Get("tenant"))
	for _, k := range []string{middleware.ReasonForPoisonedKey, middleware.PoisonedTopicKey, middleware.PoisonedHandlerKey, middleware.PoisonedSubscriberKey} {
		require.Empty(t, replayed.Metadata.Get(k), "the poison queue's %s is removed", k)
	}

	again, err := outboxops.ReplayParkedGroup(ctx, db, schema, outboxops.ParkedGroupRequest{Fingerprint: notFound.Fingerprint, Offsets: dry.Offsets[:2]})
	require.NoError(t, err)
	require.Empty(t, again.Offsets, "a parked copy is replayed once")
	discarded, err := outboxops.DiscardParkedGroup(ctx, db, schema, outboxops.ParkedGroupRequest{Fingerprint: bad.Fingerprint})
	require.NoError(t, err)
	require.Len(t, discarded.Offsets, 1)
	remaining, _, err := outboxops.ParkedGroups(ctx, db, schema, 0)
	require.NoError(t, err)
	require.Len(t, remaining, 1)
	require.Equal(t, int64(1), remaining[0].Rows, "order-2 was not asked for")
	newest, left, err := outboxops.ParkedGroups(ctx, db, schema, 1)
	require.NoError(t, err)
	require.Zero(t, left, "one parked copy is left to group")
	require.Len(t, newest, 1)
	// A settled copy that outbox retention deleted is forgotten at the next settle.
	settled := func() int {
		return pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox_parked_settled"))
	}
	require.Equal(t, 3, settled())
	pgtest.Exec(t, db, `DELETE FROM `+pgtx.QualifiedName(schema, "outbox")+` WHERE "offset" = $1`, dry.Offsets[0])
	_, err = outboxops.DiscardParkedGroup(ctx, db, schema, outboxops.ParkedGroupRequest{Fingerprint: notFound.Fingerprint})
	require.NoError(t, err)
	require.Equal(t, 3, settled(), "order-0's record went with its row; order-2's was added")
	_, err = outboxops.ReplayParkedGroup(ctx, db, schema, outboxops.ParkedGroupRequest{Fingerprint: "nope"})
	require.ErrorContains(t, err, "fingerprint must be 16")
}
