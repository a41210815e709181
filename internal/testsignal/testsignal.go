// Package testsignal lets tests wait on events inside the code under test instead of polling
// for their effects. A component keeps a TestSignals struct of Signal fields (nil channels
// outside tests) and calls Signal at each event worth waiting for: a relay round, a processed
// row, a janitor round. A test calls Init on the fields it needs, through the component's
// export_test.go, and WaitOrTimeout on them.
//
// Production code pays one nil check per event. A Signal is safe for concurrent use.
package testsignal

import (
	"fmt"
	"time"
)

// Timeout is how long WaitOrTimeout waits: generous, since tests share two cores with other
// packages' tests; a test that passes never waits this long.
const Timeout = 30 * time.Second

// bufferSize bounds the events a test may leave unread before Signal blocks the code under
// test: more than any test sends, so that reading only some of them is fine.
const bufferSize = 10_000

// Signal carries events of type T from the code under test to a test. The zero value is
// inert: Signal does nothing until Init is called.
type Signal[T any] struct {
	ch chan T
}

// Init makes s carry events. Call it before the component runs (it is not synchronised with
// Signal).
func (s *Signal[T]) Init() { s.ch = make(chan T, bufferSize) }

// Signal sends v to a test that initialised s, and does nothing otherwise. If the test has
// left bufferSize events unread it panics rather than block the component.
func (s *Signal[T]) Signal(v T) {
	if s.ch == nil {
		return
	}
	select {
	case s.ch <- v:
	default:
		panic(fmt.Sprintf("testsignal: %d events of %T left unread", bufferSize, v))
	}
}

// WaitOrTimeout returns the next event, and panics (failing the test) when none comes within
// Timeout.
func (s *Signal[T]) WaitOrTimeout() T {
	if s.ch == nil {
		panic("testsignal: WaitOrTimeout on a signal that was never initialised")
	}
	select {
	case v := <-s.ch:
		return v
	case <-time.After(Timeout):
		var zero T
		panic(fmt.Sprintf("testsignal: no %T event within %s", zero, Timeout))
	}
}

// WaitFor returns the first event for which match is true, discarding the others, and panics
// when none comes within Timeout.
func (s *Signal[T]) WaitFor(match func(T) bool) T {
	deadline := time.After(Timeout)
	for {
		select {
		case v := <-s.ch:
			if match(v) {
				return v
			}
		case <-deadline:
			var zero T
			panic(fmt.Sprintf("testsignal: no matching %T event within %s", zero, Timeout))
		}
	}
}

// C returns the channel events arrive on, for a test that selects on several things.
func (s *Signal[T]) C() <-chan T { return s.ch }
