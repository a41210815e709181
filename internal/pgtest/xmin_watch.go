package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// WatchOldTransactions records, while t runs, every transaction on the server that holds a
// transaction ID for longer than age, and logs them if t fails. watermill-sql's subscribers read
// only rows below the oldest such transaction on the whole server, so one of them, in any test
// binary, stalls every SQL subscription until it ends: by the time a test fails the holder may
// be gone, and OldTransactions, asked then, finds nothing. The watch samples twice a second.
func WatchOldTransactions(t testing.TB, age time.Duration) {
	t.Helper()
	db := DB(t)
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu   sync.Mutex
		seen = map[string]*heldTx{}
		done = make(chan struct{})
	)
	record := func() {
		for _, h := range sampleHeldTxs(ctx, db, age) {
			mu.Lock()
			if prev, ok := seen[h.key]; ok {
				prev.open, prev.state, prev.query = h.open, h.state, h.query
			} else {
				h.first = time.Now()
				seen[h.key] = h
			}
			mu.Unlock()
		}
	}
	record() // what holds back the reads already when the test starts
	go func() {
		defer close(done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				record()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if !t.Failed() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			t.Logf("pgtest: no transaction held a transaction ID for longer than %s while this test ran", age)
			return
		}
		list := make([]*heldTx, 0, len(seen))
		for _, h := range seen {
			list = append(list, h)
		}
		sort.Slice(list, func(i, j int) bool { return list[i].start < list[j].start })
		var b strings.Builder
		for _, h := range list {
			fmt.Fprintf(&b, "\n  pid %d (%s), began %s, seen at %s, open at least %s, last %s: %s",
				h.pid, h.app, h.start, h.first.Format("15:04:05.000"), h.open, h.state, h.query)
		}
		t.Logf("pgtest: transactions that held a transaction ID for longer than %s while this test ran (each holds back every SQL subscription on the server):%s", age, b.String())
	})
}

// sampleHeldTxs lists the transactions holding a transaction ID for longer than age; a failed
// query lists none (the watch only explains failures).
func sampleHeldTxs(ctx context.Context, db *sql.DB, age time.Duration) []*heldTx {
	rows, err := db.QueryContext(ctx, `SELECT pid, backend_start::text, xact_start::text, (now() - xact_start)::text,
		coalesce(application_name, ''), coalesce(state, ''), left(regexp_replace(coalesce(query, ''), '\s+', ' ', 'g'), 300)
		FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND xact_start < now() - $1::interval AND pid <> pg_backend_pid()`,
		fmt.Sprintf("%d milliseconds", age.Milliseconds()))
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []*heldTx
	for rows.Next() {
		var h heldTx
		var backendStart string
		if rows.Scan(&h.pid, &backendStart, &h.start, &h.open, &h.app, &h.state, &h.query) != nil {
			return out
		}
		h.key = fmt.Sprintf("%d %s %s", h.pid, backendStart, h.start)
		out = append(out, &h)
	}
	_ = rows.Err() // a partial sample is still a sample
	return out
}

type heldTx struct {
	key                            string
	pid                            int
	start, open, app, state, query string
	first                          time.Time
}
