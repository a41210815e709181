package once

import (
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
)

// recordingObserver records what the middleware tells its duplicateObserver.
type recordingObserver struct {
	mu         sync.Mutex
	mismatches []bool // one per duplicate told
	closed     bool
}

func (o *recordingObserver) duplicate(_ string, mismatch bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mismatches = append(o.mismatches, mismatch)
}

func (o *recordingObserver) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
}

// Operators' features follow deliveries through one hook: each skipped duplicate is told to
// the observer exactly once, with whether its payload differed, and Close closes it; a fresh
// message tells it nothing.
func TestEachDuplicateIsToldToTheObserverOnce(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	mw, err := New(db, Config{Schema: schema, Consumer: "c"}, nil)
	require.NoError(t, err)
	rec := &recordingObserver{}
	mw.observer = rec
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for _, m := range []struct{ uuid, payload string }{{"e-1", "p"}, {"e-1", "p"}, {"e-1", "other"}, {"e-2", "p"}} {
		_, err := h(message.NewMessage(m.uuid, []byte(m.payload)))
		require.NoError(t, err)
	}
	require.NoError(t, mw.Close())
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Equal(t, []bool{false, true}, rec.mismatches, "a duplicate, then a duplicate with another payload")
	require.True(t, rec.closed)
	require.Equal(t, uint64(2), mw.Counters().Consumer("c").Duplicates)
}
