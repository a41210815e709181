package inbox_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// A handler output the outbox can never store (here an empty UUID) fails every attempt the same
// way: the row is parked at the first attempt, not retried up to MaxAttempts.
func testUnstorableOutputParksTheRowAtOnce(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	cfg := fast("c")
	cfg.MaxAttempts = 5
	cfg.OutputTopic = "cashback"
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("", []byte("no id"))}, nil
	}, cfg)
	require.NoError(t, r.Handle(msg("u1", "p")))
	p.until(t, "the row to be parked", func(n tally) bool { return n.Parked == 1 })
	require.Equal(t, 1, e.status(t, "c", inbox.StatusFailed))
	require.Equal(t, 1, pgtest.Count(t, e.db, `SELECT attempts FROM `+e.table("inbox")+` WHERE consumer = 'c'`), "parked at the first attempt")
}
