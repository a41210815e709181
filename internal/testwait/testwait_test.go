package testwait

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fatalTB records a Fatalf instead of stopping the goroutine, so the failure path is testable.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = format
	for _, a := range args {
		if s, ok := a.(string); ok {
			f.msg += " " + s
		}
	}
}

func TestUntilReturnsWhenTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	Until(t, "the third look", func() bool { return n.Add(1) == 3 })
	if n.Load() != 3 {
		t.Fatalf("looked %d times, want 3", n.Load())
	}
}

func TestUntilWithinFailsNamingWhatItAwaited(t *testing.T) {
	f := &fatalTB{TB: t}
	UntilWithin(f, 30*time.Millisecond, "the impossible", func() bool { return f.msg != "" })
	if !strings.Contains(f.msg, "the impossible") {
		t.Fatalf("failure %q does not say what was awaited", f.msg)
	}
}

func TestReceive(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if v := Receive(t, ch, "seven"); v != 7 {
		t.Fatalf("got %d", v)
	}
	done := make(chan struct{})
	close(done)
	Closed(t, done, "done")
}
