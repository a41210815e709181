// Package lifecycle is the Run/Close plumbing shared by the background workers (the outbox
// relay, the retention janitor, the intent sender): Close cancels what Run is doing and waits
// for Run to return.
package lifecycle

import (
	"context"
	"sync"
	"time"
)

// Runner is embedded by a worker. Its zero value is ready to use.
type Runner struct {
	mu      sync.Mutex
	closing chan struct{}
	once    sync.Once
	running sync.WaitGroup
}

func (r *Runner) closingCh() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing == nil {
		r.closing = make(chan struct{})
	}
	return r.closing
}

// Start is called at the top of Run: the returned context ends when parent ends or Close is
// called (also if Close came first), and done, deferred by Run, lets Close return.
func (r *Runner) Start(parent context.Context) (ctx context.Context, done func()) {
	r.running.Add(1)
	ctx, cancel := context.WithCancel(parent)
	closing := r.closingCh()
	go func() {
		select {
		case <-closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		cancel()
		r.running.Done()
	}
}

// Close stops Run and waits for it to return. It is idempotent.
func (r *Runner) Close() error {
	r.once.Do(func() { close(r.closingCh()) })
	r.running.Wait()
	return nil
}

// Sleep waits for d and reports true, or reports false as soon as ctx ends.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
