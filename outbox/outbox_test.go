package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

func TestRelayKeepsCommitOrderAcrossTopicsAndBatches(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	publishTx(t, db, w, "a", "1", "2")
	publishTx(t, db, w, "b", "3")
	publishTx(t, db, w, "a", "4", "5", "6")
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, BatchSize: 2}, nil)
	require.NoError(t, err)
	drain(t, r, s, 6)
	require.Equal(t, []string{"a/1", "a/2", "b/3", "a/4", "a/5", "a/6"}, s.all())

	// Nothing is published twice once the position is recorded.
	n, err := r.RelayOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	require.Len(t, s.all(), 6)
}

func TestRolledBackRowsNeverReachTheRelay(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	err := pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		require.NoError(t, w.PublishTx(ctx, tx, "a", message.NewMessage("ghost", []byte(`{}`))))
		return errors.New("business write failed")
	})
	require.Error(t, err)
	publishTx(t, db, w, "a", "real")
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	drain(t, r, s, 1)
	require.Equal(t, []string{"a/real"}, s.all())
}

func TestRelayCrashBeforeRecordingRepublishes(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	publishTx(t, db, w, "a", "e-91")
	// The broker accepts the message, then the relay dies before recording its position: to
	// the relay this is a failed publish, so the next round publishes the same row again.
	var once sync.Once
	s := &sink{}
	s.failOn = func(topic string, msgs []*message.Message) error {
		var err error
		once.Do(func() {
			for _, m := range msgs {
				s.got = append(s.got, topic+"/"+m.UUID)
			}
			err = errors.New("relay crashed after publishing")
		})
		return err
	}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, Backoff: time.Millisecond, MaxBackoff: time.Millisecond}, nil)
	require.NoError(t, err)
	drain(t, r, s, 2)
	require.Equal(t, []string{"a/e-91", "a/e-91"}, s.all(), "at least once: the copy goes out again with the same UUID")
	require.Equal(t, uint64(1), r.Counters().Failures)
}

// A row the relay cannot decode is set aside in outbox_rejected with the reason, never
// dropped, and the rows behind it go on: in a RelayOnce and in a running relay.
func TestUndecodableRowIsSetAsideNotDropped(t *testing.T) {
	t.Parallel()
	for _, running := range []bool{false, true} {
		t.Run(fmt.Sprintf("running=%v", running), func(t *testing.T) {
			t.Parallel()
			db, schema, w := setup(t)
			publishTx(t, db, w, "a", "before")
			insertUndecodable(t, db, schema, "foreign")
			publishTx(t, db, w, "a", "after")
			s := newKeyedSink(2)
			r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, PollInterval: time.Hour}, nil)
			require.NoError(t, err)
			if running {
				sig := startRelay(t, r)
				require.Equal(t, "foreign", sig.RowRejected.WaitOrTimeout())
				testwait.Closed(t, s.done, "the rows around the undecodable one")
			} else {
				drain(t, r, s, 2)
			}
			require.Equal(t, []string{"before", "after"}, s.all())
			var reason string
			require.NoError(t, db.QueryRow(`SELECT error FROM `+pgtx.QualifiedName(schema, "outbox_rejected")+` WHERE uuid = 'foreign'`).Scan(&reason))
			require.Contains(t, reason, "destination_topic")
			require.Equal(t, uint64(1), r.Counters().Rejected)
		})
	}
}

func TestOneActiveRelayPerName(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	const n = 200
	for i := range n {
		publishTx(t, db, w, "a", fmt.Sprintf("m-%03d", i))
	}
	s := newKeyedSink(n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var relays []*outbox.Relay
	for range 3 {
		r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, BatchSize: 7, PollInterval: 5 * time.Millisecond, StandbyInterval: 5 * time.Millisecond}, nil)
		require.NoError(t, err)
		relays = append(relays, r)
		go func() { _ = r.Run(ctx) }()
	}
	testwait.Closed(t, s.done, "every row to be forwarded")
	got := s.all()
	require.Len(t, got, n, "every row forwarded exactly once by the single leader")
	for i := range n {
		require.Equal(t, fmt.Sprintf("m-%03d", i), got[i])
	}
	leaders := 0
	for _, r := range relays {
		if r.Counters().IsLeader {
			leaders++
		}
	}
	require.Equal(t, 1, leaders)
	for _, r := range relays {
		require.NoError(t, r.Close())
		require.NoError(t, r.Close(), "Close is idempotent")
	}
}

// When the active relay stops, a standby of the same Name takes over from its position: what
// the first published is not published again, what commits later is.
func TestStandbyTakesOverFromThePosition(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	s := newKeyedSink(1)
	cfg := outbox.RelayConfig{Schema: schema, PollInterval: time.Hour, StandbyInterval: 5 * time.Millisecond}
	first, err := outbox.NewRelay(db, s, cfg, nil)
	require.NoError(t, err)
	firstSig := startRelay(t, first)
	firstSig.Leading.WaitOrTimeout()
	standby, err := outbox.NewRelay(db, s, cfg, nil)
	require.NoError(t, err)
	standbySig := startRelay(t, standby)

	publishTx(t, db, w, "a", "m-1")
	testwait.Closed(t, s.done, "the first relay's publish")
	require.NoError(t, first.Close())
	firstSig.StoppedLeading.WaitOrTimeout()
	standbySig.Leading.WaitOrTimeout()

	done := s.expect(2)
	publishTx(t, db, w, "a", "m-2")
	testwait.Closed(t, done, "the standby's publish, once it leads")
	require.Equal(t, []string{"m-1", "m-2"}, s.all())
}

func TestWriterRefusesBadInput(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	require.ErrorContains(t, w.PublishTx(ctx, tx, "a", message.NewMessage("", nil)), "empty UUID")
	require.ErrorContains(t, w.PublishTx(ctx, tx, "has space", message.NewMessage("x", nil)), "invalid topic")
	require.ErrorContains(t, w.PublishTx(ctx, tx, "", message.NewMessage("x", nil)), "topic is empty")
	require.ErrorIs(t, w.PublishTx(ctx, nil, "a", message.NewMessage("x", nil)), pgtx.ErrNoTransaction)
	require.NoError(t, tx.Rollback())
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")))

	_, err = outbox.NewWriter(outbox.Config{Schema: "Bad-Name"})
	require.ErrorContains(t, err, "invalid config")
	_, err = outbox.NewRelay(db, nil, outbox.RelayConfig{}, nil)
	require.ErrorContains(t, err, "publisher is nil")
	_, err = outbox.NewRelay(db, &sink{}, outbox.RelayConfig{BatchSize: -1}, nil)
	require.ErrorContains(t, err, "BatchSize")
	// A relay name is stored as text (outbox_offsets): one PostgreSQL cannot store fails here,
	// by the rule every component applies to names, not at the relay's first round.
	_, err = outbox.NewRelay(db, &sink{}, outbox.RelayConfig{Name: "kafka\x00eu"}, nil)
	require.ErrorContains(t, err, "relay Name must not contain NUL bytes")
	_, err = outbox.NewRelay(db, &sink{}, outbox.RelayConfig{Name: "kafka\xffeu"}, nil)
	require.ErrorContains(t, err, "relay Name must be valid UTF-8")
}

func TestStampsCorrelationCausationAndOccurredAt(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	consumed := message.NewMessage("in-1", nil)
	consumed.Metadata.Set(outbox.MetadataCorrelationID, "corr-1")
	ctx := outbox.ContextWithConsumed(context.Background(), consumed)
	out := message.NewMessage("out-1", []byte(`{}`))
	preset := message.NewMessage("out-2", []byte(`{}`))
	preset.Metadata.Set(outbox.MetadataOccurredAt, "2026-01-02T03:04:05Z")
	require.NoError(t, pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return w.PublishTx(ctx, tx, "a", out, preset)
	}))
	require.Equal(t, "in-1", out.Metadata.Get(outbox.MetadataCausationID))
	require.Equal(t, "corr-1", out.Metadata.Get(outbox.MetadataCorrelationID))
	_, err := time.Parse(time.RFC3339Nano, out.Metadata.Get(outbox.MetadataOccurredAt))
	require.NoError(t, err)
	require.Equal(t, "2026-01-02T03:04:05Z", preset.Metadata.Get(outbox.MetadataOccurredAt), "a producer's own time is kept")

	// The row is a forwarder envelope that Watermill's own forwarder could read.
	var payload string
	require.NoError(t, db.QueryRow(`SELECT payload::text FROM `+pgtx.QualifiedName(schema, "outbox")+` WHERE uuid = 'out-1'`).Scan(&payload))
	require.Contains(t, payload, `"destination_topic":"a"`)
	require.Contains(t, payload, `"uuid":"out-1"`)

	// Without a consumed message, a message starts its own correlation chain.
	solo := message.NewMessage("solo", nil)
	require.NoError(t, pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return w.PublishTx(ctx, tx, "a", solo)
	}))
	require.Equal(t, "solo", solo.Metadata.Get(outbox.MetadataCorrelationID))
	require.Empty(t, solo.Metadata.Get(outbox.MetadataCausationID))
}

func TestStatusReportsBacklogAndLag(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, Name: "kafka"}, nil)
	require.NoError(t, err)
	_, err = r.RelayOnce(context.Background()) // registers the relay's position
	require.NoError(t, err)
	publishTx(t, db, w, "a", "1", "2", "3")

	relays, rejected, err := outbox.Stats(context.Background(), db, schema)
	require.NoError(t, err)
	require.Zero(t, rejected)
	require.Len(t, relays, 1)
	require.Equal(t, "kafka", relays[0].Name)
	require.Equal(t, int64(3), relays[0].Backlog)
	require.False(t, relays[0].OldestPending.IsZero())
	require.GreaterOrEqual(t, relays[0].Lag, time.Duration(0))

	drain(t, r, s, 3)
	relays, _, err = outbox.Stats(context.Background(), db, schema)
	require.NoError(t, err)
	require.Zero(t, relays[0].Backlog)
	require.Zero(t, relays[0].Lag)
}

// The Run/Close rules of every worker (internal/worker.Runner): one Run at a time, Run again
// after it returned, Close final.
func TestRelayRunAgainAfterItReturnedAndCloseIsFinal(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	got := make(chan string, 16)
	s := &sink{failOn: func(_ string, msgs []*message.Message) error {
		for _, m := range msgs {
			got <- m.UUID
		}
		return nil
	}}
	forwarded := func() string {
		t.Helper()
		select {
		case u := <-got:
			return u
		case <-time.After(30 * time.Second):
			t.Fatal("the relay forwarded nothing")
			return ""
		}
	}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, PollInterval: 5 * time.Millisecond}, nil)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- r.Run(ctx) }()
	publishTx(t, db, w, "a", "m-1")
	require.Equal(t, "m-1", forwarded())
	require.ErrorContains(t, r.Run(context.Background()), "already running")
	cancel()
	require.NoError(t, <-first)

	second := make(chan error, 1)
	go func() { second <- r.Run(context.Background()) }()
	publishTx(t, db, w, "a", "m-2")
	require.Equal(t, "m-2", forwarded())
	require.NoError(t, r.Close())
	require.NoError(t, <-second, "Close stopped the second Run and waited for it")
	require.False(t, r.Counters().IsLeader, "the lock is given up")
	require.NoError(t, r.Run(context.Background()), "Run after Close returns at once")
}
