package once

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

var errShutdownGrace = errors.New("once: router closed and ShutdownGrace elapsed")

// detachForShutdown returns a context that survives the cancellation Router.Close sends to
// every in-flight message for grace, so a handler that is nearly done can commit instead of
// being rolled back and redone. Deadlines (an outer Timeout middleware) apply at once.
func detachForShutdown(orig context.Context, grace time.Duration) (context.Context, func()) {
	if grace < 0 {
		return orig, func() {}
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(orig))
	if deadline, ok := orig.Deadline(); ok {
		var cancelDeadline context.CancelFunc
		ctx, cancelDeadline = context.WithDeadline(ctx, deadline)
		prev := cancel
		// The parent first, so ctx inherits the cause: cancelling the deadline child first
		// would end it with a bare context.Canceled, and a message whose own deadline passed
		// would not report DeadlineExceeded.
		cancel = func(cause error) { prev(cause); cancelDeadline() }
	}
	var timer atomic.Pointer[time.Timer]
	stop := context.AfterFunc(orig, func() {
		if errors.Is(orig.Err(), context.DeadlineExceeded) {
			cancel(context.Cause(orig))
			return
		}
		timer.Store(time.AfterFunc(grace, func() { cancel(errShutdownGrace) }))
	})
	return ctx, func() {
		stop()
		if t := timer.Load(); t != nil {
			t.Stop()
		}
		cancel(nil)
	}
}
