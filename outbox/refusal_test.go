package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

func heldRows(t *testing.T, db *sql.DB, schema string) int {
	t.Helper()
	return pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox_held"))
}

// A message the publisher refuses for good is set aside in outbox_rejected with the
// publisher's reason; the rows behind it go on, the later row of its key included. Once the
// cause is fixed, an operator republishes it: it goes out after the rows committed before.
func TestRelaySetsAsideWhatThePublisherRefusesForGood(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	publishTx(t, db, w, "a", "k-1", "bad", "k-3") // one run of three messages of one key
	publishTx(t, db, w, "b", "b-1")
	var refuse atomic.Bool
	refuse.Store(true)
	s := &sink{failOn: func(_ string, msgs []*message.Message) error {
		for _, m := range msgs {
			if m.UUID == "bad" && refuse.Load() {
				return wmonce.Permanent(errors.New("kafka server: Message was too large, server rejected it"))
			}
		}
		return nil
	}}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	relayOnce(t, r)
	require.Equal(t, []string{"a/k-1", "a/k-3", "b/b-1"}, s.all(), "the refused message alone is left out")
	c := r.Counters()
	require.Equal(t, uint64(1), c.Rejected)
	require.Equal(t, uint64(3), c.Forwarded)
	require.Zero(t, c.HeldTopics)

	rejected, err := outboxops.ListRejected(ctx, db, schema, outboxops.RejectedFilter{}, 10, true)
	require.NoError(t, err)
	require.Len(t, rejected, 1)
	require.Equal(t, "bad", rejected[0].UUID)
	require.Equal(t, "a", rejected[0].Topic)
	require.Contains(t, rejected[0].LastError, "too large")
	require.NotNil(t, rejected[0].Payload)
	require.Zero(t, relayOnce(t, r), "a rejected row is not tried again")

	res, err := outboxops.RepublishRejected(ctx, db, schema, outboxops.RepublishRequest{Relay: "relay", Offsets: []int64{rejected[0].Offset}, DryRun: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.Republished)
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox_rejected")), "a dry run changes nothing")

	refuse.Store(false)
	publishTx(t, db, w, "a", "k-4")
	res, err = outboxops.RepublishRejected(ctx, db, schema, outboxops.RepublishRequest{Relay: "relay", Offsets: []int64{rejected[0].Offset}})
	require.NoError(t, err)
	require.Equal(t, outboxops.RepublishResult{Republished: 1, Offsets: []int64{rejected[0].Offset}}, res)
	relayOnce(t, r)
	require.Equal(t, []string{"a/k-1", "a/k-3", "b/b-1", "a/k-4", "a/bad"}, s.all(), "republished at the end, with its UUID")
	rejected, err = outboxops.ListRejected(ctx, db, schema, outboxops.RejectedFilter{}, 10, false)
	require.NoError(t, err)
	require.Empty(t, rejected)
}

// Republishing can remove a metadata key the broker refuses (a reserved one), and refuses to
// republish a row the relay cannot decode (it would only be rejected again).
func TestRepublishRemovesMetadataAndLeavesUndecodableRows(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		m := message.NewMessage("reserved", []byte("x"))
		m.Metadata.Set("_watermill_message_uuid", "spoofed")
		m.Metadata.Set("kept", "yes")
		return w.PublishTx(ctx, tx, "a", m)
	})
	require.NoError(t, err)
	insertUndecodable(t, db, schema, "foreign")
	var got []*message.Message
	s := &sink{failOn: func(_ string, msgs []*message.Message) error {
		for _, m := range msgs {
			if m.Metadata.Get("_watermill_message_uuid") != "" {
				return wmonce.Permanent(errors.New("metadata _watermill_message_uuid is reserved by watermill for message UUID"))
			}
		}
		got = append(got, msgs...)
		return nil
	}}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	relayOnce(t, r)
	require.Empty(t, s.all())
	require.Equal(t, uint64(2), r.Counters().Rejected)

	res, err := outboxops.RepublishRejected(ctx, db, schema, outboxops.RepublishRequest{Relay: "relay", All: true, RemoveMetadata: []string{"_watermill_message_uuid"}})
	require.NoError(t, err)
	require.Equal(t, 1, res.Republished)
	require.Len(t, res.Undecodable, 1)
	relayOnce(t, r)
	require.Equal(t, []string{"a/reserved"}, s.all())
	require.Equal(t, "yes", got[0].Metadata.Get("kept"))
	require.Empty(t, got[0].Metadata.Get("_watermill_message_uuid"))
	left, err := outboxops.ListRejected(ctx, db, schema, outboxops.RejectedFilter{}, 10, false)
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, "foreign", left[0].UUID)

	_, err = outboxops.RepublishRejected(ctx, db, schema, outboxops.RepublishRequest{Relay: "relay"})
	require.ErrorContains(t, err, "give the offsets")
}

// A topic the publisher fails for holds back its own rows only: the other topics go on, the
// failing topic's rows wait in outbox_held in their order (later ones behind them), and are
// published in that order once it accepts messages again; then it is released.
func TestRelayHoldsOnlyTheFailingTopic(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	publishTx(t, db, w, "missing", "m-1")
	publishTx(t, db, w, "orders", "o-1")
	publishTx(t, db, w, "missing", "m-2")
	publishTx(t, db, w, "orders", "o-2")
	var down atomic.Bool
	down.Store(true)
	s := &sink{failOn: func(topic string, _ []*message.Message) error {
		if topic == "missing" && down.Load() {
			return errors.New("kafka server: Request was for a topic or partition that does not exist on this broker")
		}
		return nil
	}}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, Backoff: time.Millisecond, MaxBackoff: time.Millisecond}, nil)
	require.NoError(t, err)
	relayOnce(t, r)
	require.Equal(t, []string{"orders/o-1", "orders/o-2"}, s.all(), "the other topic goes on")
	c := r.Counters()
	require.Equal(t, 1, c.HeldTopics)
	require.Equal(t, uint64(2), c.Held)
	require.Zero(t, c.Rejected, "a transient failure rejects nothing")
	relays, _, err := outbox.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.Equal(t, int64(2), relays[0].Backlog, "held rows are not published yet")
	require.Len(t, relays[0].Held, 1)
	require.Equal(t, "missing", relays[0].Held[0].Topic)
	require.Equal(t, int64(2), relays[0].Held[0].Rows)

	publishTx(t, db, w, "missing", "m-3")
	publishTx(t, db, w, "orders", "o-3")
	relayOnce(t, r)
	require.Equal(t, []string{"orders/o-1", "orders/o-2", "orders/o-3"}, s.all())
	require.Equal(t, 3, heldRows(t, db, schema), "a later row of a held topic waits behind the held ones")

	down.Store(false)
	relayOnce(t, r)
	require.Equal(t, []string{"orders/o-1", "orders/o-2", "orders/o-3", "missing/m-1", "missing/m-2", "missing/m-3"}, s.all())
	require.Zero(t, heldRows(t, db, schema))
	require.Zero(t, r.Counters().HeldTopics, "released")
	relays, _, err = outbox.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.Zero(t, relays[0].Backlog)
	require.Empty(t, relays[0].Held)

	publishTx(t, db, w, "missing", "m-4")
	relayOnce(t, r)
	require.Equal(t, "missing/m-4", s.all()[6], "a released topic is published directly")
	require.Equal(t, uint64(3), r.Counters().Held)
}

// The running relay tries a held topic again with backoff while it waits, without a new row
// to wake it, and releases the topic once its rows are out.
func TestRunningRelayRetriesAHeldTopicAndReleasesIt(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	var down atomic.Bool
	down.Store(true)
	published := make(chan string, 16)
	s := &sink{failOn: func(topic string, msgs []*message.Message) error {
		if topic == "missing" && down.Load() {
			return errors.New("no such topic")
		}
		for _, m := range msgs {
			published <- topic + "/" + m.UUID
		}
		return nil
	}}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, nil)
	require.NoError(t, err)
	sig := startRelay(t, r)
	publishTx(t, db, w, "missing", "m-1")
	publishTx(t, db, w, "orders", "o-1")
	require.Equal(t, "orders/o-1", testwait.Receive(t, published, "the other topic's row"))
	require.Equal(t, "missing", sig.TopicHeld.WaitOrTimeout())
	require.Equal(t, 1, r.Counters().HeldTopics)
	down.Store(false)
	require.Equal(t, "missing/m-1", testwait.Receive(t, published, "the held row, once the topic accepts it (PollInterval is an hour: only the held topic's backoff wakes the relay)"))
	require.Equal(t, "missing", sig.TopicReleased.WaitOrTimeout())
	require.Zero(t, r.Counters().HeldTopics)
}

// Whatever RelayConfig.IsPermanent says, a connection error is never a refusal for good: the
// row is held and published later, not rejected.
func TestConnectionErrorsAreNeverPermanent(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	publishTx(t, db, w, "a", "m-1")
	var calls atomic.Int32
	s := &sink{failOn: func(string, []*message.Message) error {
		if calls.Add(1) == 1 {
			return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		}
		return nil
	}}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, Backoff: time.Millisecond, MaxBackoff: time.Millisecond,
		IsPermanent: func(error) bool { return true }}, nil)
	require.NoError(t, err)
	relayOnce(t, r)
	require.Zero(t, r.Counters().Rejected)
	require.Equal(t, 1, heldRows(t, db, schema))
	relayOnce(t, r)
	require.Equal(t, []string{"a/m-1"}, s.all())
}
