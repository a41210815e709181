package inbox

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/pgtx"
)

// worker is what the lease upkeep and shutdown need to know about one worker.
type worker struct {
	mu      sync.Mutex
	owned   map[int64]int64 // row id -> claim token, for rows claimed and not yet settled
	started map[int64]bool  // owned rows whose processing has begun
	txStart time.Time       // start of the current processing transaction; zero between them
}

func (w *worker) own(rows []claimedRow, token int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range rows {
		w.owned[r.id] = token
	}
}

// begin marks rows as started and returns those still owned: at shutdown, rows not yet
// started may have been taken away and released.
func (w *worker) begin(rows []claimedRow) []claimedRow {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := rows[:0:0]
	for _, r := range rows {
		if _, ok := w.owned[r.id]; ok {
			w.started[r.id] = true
			out = append(out, r)
		}
	}
	return out
}

// takeUnstarted removes and returns the owned rows not started yet, except keep.
func (w *worker) takeUnstarted(keep ...int64) (rowIDs, tokens []int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, token := range w.owned {
		if !w.started[id] && !slices.Contains(keep, id) {
			rowIDs = append(rowIDs, id)
			tokens = append(tokens, token)
			delete(w.owned, id)
		}
	}
	return rowIDs, tokens
}

func (w *worker) settle(ids ...int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range ids {
		delete(w.owned, id)
		delete(w.started, id)
	}
}

func (w *worker) beginTx() {
	w.mu.Lock()
	w.txStart = time.Now()
	w.mu.Unlock()
}

func (w *worker) endTx() {
	w.mu.Lock()
	w.txStart = time.Time{}
	w.mu.Unlock()
}

// releaseUnstarted gives back the rows a worker claimed but has not started, except keep.
func (p *Processor) releaseUnstarted(w *worker, keep ...int64) {
	if rowIDs, tokens := w.takeUnstarted(keep...); len(rowIDs) > 0 {
		p.releasePairs(rowIDs, tokens, 0)
	}
}

// release gives claimed rows back (PENDING, attempt not counted, due after delay), fenced by
// token.
func (p *Processor) release(rows []claimedRow, token int64, delay time.Duration) {
	if len(rows) == 0 {
		return
	}
	tokens := make([]int64, len(rows))
	for i := range tokens {
		tokens[i] = token
	}
	p.releasePairs(ids(rows), tokens, delay)
}

func (p *Processor) releasePairs(rowIDs, tokens []int64, delay time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	released, err := p.releaseRows(ctx, rowIDs, tokens, delay)
	if err != nil {
		p.errs.Add(1)
		p.logger.Error("Could not release claimed rows; they return when their lease expires", err, watermill.LogFields{"rows": len(rowIDs)})
		return
	}
	p.released.Add(uint64(len(released)))
	for _, id := range released {
		p.testSignals.Settled.Signal(settledRow{ID: id, As: settledReleased})
	}
}

// releaseAllOwned gives back whatever any worker still holds: rows of handlers that ignored
// cancellation at shutdown. Their late completion is refused by the token.
func (p *Processor) releaseAllOwned() {
	var rowIDs, tokens []int64
	for _, w := range p.workers {
		w.mu.Lock()
		for id, token := range w.owned {
			rowIDs = append(rowIDs, id)
			tokens = append(tokens, token)
		}
		w.mu.Unlock()
	}
	if len(rowIDs) > 0 {
		p.releasePairs(rowIDs, tokens, 0)
	}
}

// releaseRows runs the release statement and returns the ids of the rows it gave back.
func (p *Processor) releaseRows(ctx context.Context, rowIDs, tokens []int64, delay time.Duration) ([]int64, error) {
	return pgtx.QueryAll(ctx, p.db, scanRowID, p.q.release, rowIDs, tokens, micros(delay))
}

func scanRowID(s pgtx.Scanner) (int64, error) {
	var id int64
	err := s.Scan(&id)
	return id, err
}
