package once_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
)

// A redelivery storm is counted, not logged line by line at info: the first duplicate of a
// quiet spell, then one summary a minute with how many were skipped.
func TestDuplicatesAreSummarisedAtInfo(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	logs := watermill.NewCaptureLogger()
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	mw, err := once.New(db, once.Config{Schema: schema, Consumer: "c", Now: clock}, logs)
	require.NoError(t, err)
	h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })

	infoLines := func() (n int) {
		for _, m := range logs.Captured()[watermill.InfoLogLevel] {
			if strings.Contains(m.Msg, "Duplicate") {
				n++
			}
		}
		return n
	}
	require.NoError(t, deliver(h, "e-1", "p"))
	for range 200 {
		require.NoError(t, deliver(h, "e-1", "p"))
	}
	require.Equal(t, uint64(200), mw.Counters().Consumer("c").Duplicates)
	require.Equal(t, 1, infoLines(), "the first duplicate, then silence within the interval")
	debug := 0
	for _, m := range logs.Captured()[watermill.DebugLogLevel] {
		if strings.Contains(m.Msg, "Duplicate skipped") {
			debug++
		}
	}
	require.Equal(t, 200, debug, "each one at debug level")

	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	require.NoError(t, deliver(h, "e-1", "p"))
	require.Equal(t, 2, infoLines())
	last := logs.Captured()[watermill.InfoLogLevel]
	summary := last[len(last)-1]
	require.Contains(t, summary.Msg, "since the last summary")
	require.Equal(t, uint64(200), summary.Fields["duplicates"], "199 within the interval and the one that ends it")
}
