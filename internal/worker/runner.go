package worker

import (
	"context"
	"errors"
	"sync"
)

// ErrRunning is returned by Runner.Run while another Run of the same worker is running.
var ErrRunning = errors.New("worker: Run is already running (one Run at a time)")

// Runner is the Run/Close lifecycle a worker embeds. Its zero value is ready to use.
//
// Semantics, the same for every worker:
//   - one Run at a time: a Run while another runs returns ErrRunning at once;
//   - a Run that returned because its context ended may be called again;
//   - Close cancels the running Run's context, waits for Run to return and is final: a Run
//     after Close returns nil at once without doing any work. Close is idempotent.
type Runner struct {
	mu      sync.Mutex
	closed  bool
	running bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// Run calls fn with a context that ends when ctx ends or Close is called, and returns what fn
// returns (see Runner for the rules).
func (r *Runner) Run(ctx context.Context, fn func(ctx context.Context) error) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	if r.running {
		r.mu.Unlock()
		return ErrRunning
	}
	ctx, cancel := context.WithCancel(ctx)
	r.running, r.cancel, r.done = true, cancel, make(chan struct{})
	done := r.done
	r.mu.Unlock()
	defer func() {
		cancel()
		r.mu.Lock()
		r.running, r.cancel = false, nil
		r.mu.Unlock()
		close(done)
	}()
	return fn(ctx)
}

// Close stops Run and waits for it to return; Run is not run again. It is idempotent.
func (r *Runner) Close() error {
	r.mu.Lock()
	r.closed = true
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return nil
}

// Closed reports whether Close was called.
func (r *Runner) Closed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}
