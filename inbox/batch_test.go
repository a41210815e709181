package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
)

// A batch handler in the Processor gets a transaction's rows together, once, and writes them
// with one statement; a row it fails fails alone (the batch falls back to one row per
// transaction), and nothing of its first batch commits.
func TestProcessorRunsABatchHandlerOncePerTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	var calls [][]string
	bad := errors.New("row m-7 is invalid")
	h := once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.UUID
		}
		mu.Lock()
		calls = append(calls, ids)
		mu.Unlock()
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+e.table("effects")+` (message_id) SELECT unnest($1::text[])`, ids); err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.UUID == "m-7" { // its row was written above: it must not commit
				return nil, &once.BatchError{Failed: map[*message.Message]error{m: wmonce.Permanent(bad)}}
			}
		}
		return nil, nil
	})
	var msgs []*message.Message
	for i := range 40 {
		msgs = append(msgs, msg(fmt.Sprintf("m-%d", i), "{}"))
	}
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	storeAll(t, e, r, msgs)
	cfg := fast("c")
	cfg.Workers, cfg.TxBatchSize, cfg.BatchSize = 1, 20, 40
	p := e.start(t, h, cfg)
	p.until(t, "every row settled", func(s tally) bool { return s.Done+s.Parked+s.Failed >= 40 })

	require.Equal(t, 39, e.status(t, "c", inbox.StatusDone))
	require.Equal(t, 1, e.status(t, "c", inbox.StatusFailed))
	require.Equal(t, 39, e.effects(t), "each good row's write once, none of m-7's")
	require.Equal(t, 39, pgtest.Count(t, e.db, `SELECT count(DISTINCT message_id) FROM `+e.table("effects")))
	mu.Lock()
	defer mu.Unlock()
	t.Logf("calls: %v", calls)
	require.True(t, slices.ContainsFunc(calls, func(c []string) bool { return len(c) == 20 && !slices.Contains(c, "m-7") }),
		"a transaction's 20 rows reached the batch function in one call")
}
