package once

import (
	"context"
	"errors"
	"testing"
	"time"
)

// laterDeadline expires like its embedded context but reports a later deadline, so the
// detached context's own deadline timer cannot fire first: the cancellation then comes only
// through the AfterFunc on the original context, the path that lost the cause.
type laterDeadline struct{ context.Context }

func (laterDeadline) Deadline() (time.Time, bool) { return time.Now().Add(time.Hour), true }

// A message whose own deadline passes must give up with DeadlineExceeded as the cause, whichever
// of the two timers (the original's, the detached copy's) fires first.
func TestDetachForShutdownKeepsTheDeadlineCause(t *testing.T) {
	t.Parallel()
	orig, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	ctx, release := detachForShutdown(laterDeadline{orig}, time.Hour)
	defer release()
	<-ctx.Done()
	if cause := context.Cause(ctx); !errors.Is(cause, context.DeadlineExceeded) {
		t.Fatalf("cause = %v, want context.DeadlineExceeded", cause)
	}
}
