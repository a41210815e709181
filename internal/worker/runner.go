package worker

import (
	"context"
	"errors"
	"sync"
)

// ErrRunning is returned by Runner.Run while another Run of the same worker is running.
var ErrRunning = errors.New("already running: one Run at a time")

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
	ctx, end, err := r.begin(ctx)
	if ctx == nil || err != nil {
		return err
	}
	defer end()
	return fn(ctx)
}

// Start is Run in a goroutine of its own, for a worker that starts working at construction
// (inbox.Receiver). It returns once the run is registered, so that a Close that follows cancels
// it and waits for it; after Close it starts nothing.
func (r *Runner) Start(ctx context.Context, fn func(ctx context.Context)) error {
	ctx, end, err := r.begin(ctx)
	if ctx == nil || err != nil {
		return err
	}
	go func() {
		defer end()
		fn(ctx)
	}()
	return nil
}

// begin registers a run. It returns a nil context (and no error) after Close.
func (r *Runner) begin(parent context.Context) (context.Context, func(), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, nil, nil
	}
	if r.running {
		return nil, nil, ErrRunning
	}
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	r.running, r.cancel, r.done = true, cancel, done
	return ctx, func() {
		cancel()
		r.mu.Lock()
		r.running, r.cancel = false, nil
		r.mu.Unlock()
		close(done)
	}, nil
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
