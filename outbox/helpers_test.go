package outbox_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// The helpers the outbox tests share: publishers that record what the relay published, a
// schema with a Writer, and ways to run a relay.

// sink records "topic/uuid" for every message published; failOn, when set, may refuse a call.
type sink struct {
	mu     sync.Mutex
	got    []string // topic/uuid
	failOn func(topic string, msgs []*message.Message) error
}

func (s *sink) Publish(topic string, msgs ...*message.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failOn != nil {
		if err := s.failOn(topic, msgs); err != nil {
			return err
		}
	}
	for _, m := range msgs {
		s.got = append(s.got, topic+"/"+m.UUID)
	}
	return nil
}
func (s *sink) Close() error { return nil }
func (s *sink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

func setup(t *testing.T) (*sql.DB, string, *outbox.Writer) {
	t.Helper()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	return db, schema, w
}

func publishTx(t *testing.T, db *sql.DB, w *outbox.Writer, topic string, uuids ...string) {
	t.Helper()
	err := pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		msgs := make([]*message.Message, len(uuids))
		for i, u := range uuids {
			msgs[i] = message.NewMessage(u, []byte(`{"n":"`+u+`"}`))
		}
		return w.PublishTx(ctx, tx, topic, msgs...)
	})
	require.NoError(t, err)
}

// drain runs RelayOnce until want messages arrived. Every row it waits for has committed
// (or, with a hold's backoff of a millisecond, is due), so each call makes progress: one that
// finds nothing to do while messages are missing fails the test.
func drain(t *testing.T, r *outbox.Relay, s interface{ all() []string }, want int) {
	t.Helper()
	for len(s.all()) < want {
		n, err := r.RelayOnce(context.Background())
		require.NoError(t, err)
		require.NotZero(t, n, "the relay has nothing left to do, and delivered %d of %d messages: %v", len(s.all()), want, s.all())
	}
}

// keyedSink records what was published and closes done once want messages arrived.
type keyedSink struct {
	mu   sync.Mutex
	got  []string
	want int
	done chan struct{}
}

func newKeyedSink(want int) *keyedSink { return &keyedSink{want: want, done: make(chan struct{})} }

func (s *keyedSink) Publish(_ string, msgs ...*message.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		s.got = append(s.got, m.UUID)
	}
	if len(s.got) >= s.want && len(s.got)-len(msgs) < s.want {
		close(s.done)
	}
	return nil
}
func (s *keyedSink) Close() error { return nil }

// expect sets the number of messages at which the returned channel is closed.
func (s *keyedSink) expect(want int) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.want, s.done = want, make(chan struct{})
	return s.done
}
func (s *keyedSink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// insertUndecodable stores a row the relay cannot decode (no forwarder envelope), as something
// other than the Writer would.
func insertUndecodable(t *testing.T, db *sql.DB, schema, uuid string) {
	t.Helper()
	pgtest.Exec(t, db, `INSERT INTO `+pgtx.QualifiedName(schema, "outbox")+` (uuid, payload, metadata, transaction_id) VALUES ($1, '{"not":"an envelope"}', '{}', pg_current_xact_id())`, uuid)
}

// relayOnce runs one RelayOnce, bounded: before the relay held failing topics, a failing
// publish was retried until the context ended.
func relayOnce(t *testing.T, r *outbox.Relay) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testwait.Timeout)
	defer cancel()
	n, err := r.RelayOnce(ctx)
	require.NoError(t, err)
	return n
}

// startRelay initialises r's test signals, runs r until the test ends and returns the
// signals. Events nobody reads stay buffered: give the relay a PollInterval and backoff that
// keep their number small.
func startRelay(t *testing.T, r *outbox.Relay) *outbox.RelayTestSignals {
	t.Helper()
	sig := outbox.RelaySignals(r)
	sig.Leading.Init()
	sig.StoppedLeading.Init()
	sig.RoundDone.Init()
	sig.TopicHeld.Init()
	sig.TopicReleased.Init()
	sig.RowRejected.Init()
	sig.Waiting.Init()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	})
	return sig
}

// waitIdleListening waits until the relay is waiting with its LISTEN connection up.
func waitIdleListening(sig *outbox.RelayTestSignals) {
	sig.Waiting.WaitFor(func(w outbox.RelayWait) bool { return w.Listening })
}
