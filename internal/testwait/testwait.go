// Package testwait is the tests' one way to wait for a condition the code under test offers no
// signal for: poll it until it holds, and fail the test, saying what was awaited, when it does
// not within a generous timeout. Prefer a signal (a hook, a channel, a Run that returns) where the
// code has one; use this for the rest, never a bare sleep or a hand-written deadline loop.
package testwait

import (
	"testing"
	"time"
)

// Timeout is how long Until waits by default: generous, because the tests share two cores with
// other packages' tests and must not depend on timing. A test that passes never waits this long.
const Timeout = 30 * time.Second

// Interval is how often Until looks at its condition.
const Interval = 10 * time.Millisecond

// Until polls cond until it returns true and fails t, saying it timed out waiting for what, when
// it has not after Timeout. cond runs on the test's goroutine, so it may use require.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	UntilWithin(t, Timeout, what, cond)
}

// UntilWithin is Until with a timeout of its own, for a wait whose bound is the behaviour under
// test.
func UntilWithin(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(Interval)
	}
}

// Receive waits for a value from ch and fails t with what when none comes within Timeout (or ch
// is closed).
func Receive[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatalf("channel closed while waiting for %s", what)
		}
		return v
	case <-time.After(Timeout):
		t.Fatalf("timed out after %v waiting for %s", Timeout, what)
	}
	var zero T
	return zero
}

// Closed waits until ch is closed (or receives) and fails t with what when it is not within
// Timeout.
func Closed[T any](t testing.TB, ch <-chan T, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(Timeout):
		t.Fatalf("timed out after %v waiting for %s", Timeout, what)
	}
}
