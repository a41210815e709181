package worker

import (
	"sync/atomic"
	"time"
)

// Stamp is a time written by a loop and read by other goroutines (a component's Counters: its
// last round). The zero Stamp reads as the zero time: never.
type Stamp struct{ unixNano atomic.Int64 }

// SetNow records the current time.
func (s *Stamp) SetNow() { s.unixNano.Store(time.Now().UnixNano()) }

// Time returns the recorded time, or the zero time if none was recorded.
func (s *Stamp) Time() time.Time {
	n := s.unixNano.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
