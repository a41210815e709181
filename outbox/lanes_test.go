package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// slowSink records each message and how many Publish calls ran at once.
type slowSink struct {
	mu         sync.Mutex
	byKey      map[string][]int
	count      int
	inCall     atomic.Int32
	maxInCalls atomic.Int32
}

func (s *slowSink) Publish(_ string, msgs ...*message.Message) error {
	n := s.inCall.Add(1)
	defer s.inCall.Add(-1)
	for {
		m := s.maxInCalls.Load()
		if n <= m || s.maxInCalls.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(2 * time.Millisecond) // like a broker round trip
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		var seq int
		_, _ = fmt.Sscan(m.Metadata.Get("seq"), &seq)
		k := m.Metadata.Get("partition_key")
		s.byKey[k] = append(s.byKey[k], seq)
		s.count++
	}
	return nil
}
func (s *slowSink) Close() error { return nil }

// With PublishLanes, a batch is published by concurrent calls, and messages of one key still
// arrive in commit order, each once.
func TestRelayLanesKeepPerKeyOrder(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	const keys, perKey = 7, 40
	seq := 0
	for tx := range 20 {
		err := pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, sqlTx *sql.Tx) error {
			var msgs []*message.Message
			for i := range keys * perKey / 20 {
				m := message.NewMessage(fmt.Sprintf("m-%d-%d", tx, i), []byte(`{}`))
				m.Metadata.Set("partition_key", fmt.Sprintf("k%d", (tx+i)%keys))
				m.Metadata.Set("seq", fmt.Sprint(seq))
				seq++
				msgs = append(msgs, m)
			}
			return w.PublishTx(ctx, sqlTx, "orders", msgs...)
		})
		require.NoError(t, err)
	}
	s := &slowSink{byKey: map[string][]int{}}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema, BatchSize: 50, PublishLanes: 4, PollInterval: 5 * time.Millisecond}, nil)
	require.NoError(t, err)
	sig := outbox.RelaySignals(r)
	sig.RoundDone.Init()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for published := 0; published < keys*perKey; {
		published += sig.RoundDone.WaitOrTimeout()
	}
	require.NoError(t, r.Close())
	require.NoError(t, <-done)

	// Close returned after Run recorded the position of everything it published.
	n, err := r.RelayOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n, "the position covers everything published")

	s.mu.Lock()
	defer s.mu.Unlock()
	require.Equal(t, keys*perKey, s.count, "each message once")
	for k, seqs := range s.byKey {
		for i := 1; i < len(seqs); i++ {
			require.Less(t, seqs[i-1], seqs[i], "key %s out of commit order: %v", k, seqs)
		}
	}
	require.Len(t, s.byKey, keys)
	require.Greater(t, s.maxInCalls.Load(), int32(1), "lanes published concurrently")
}

func TestRelayLanesValidation(t *testing.T) {
	t.Parallel()
	db, schema, _ := setup(t)
	for _, lanes := range []int{-1, 257} {
		_, err := outbox.NewRelay(db, &sink{}, outbox.RelayConfig{Schema: schema, PublishLanes: lanes}, nil)
		require.ErrorContains(t, err, "PublishLanes")
	}
}
