// Package adminhook hands the admin page's browser tests, which live in the e2e module, what
// package admin keeps to itself: a history sample taken as if at a given time, so a test draws
// an hour of charts without waiting an hour. Package admin sets it when it is linked; nothing
// else calls it.
package adminhook

import (
	"context"
	"time"
)

// SampleAt takes a history sample of h, an *admin.Handler, as if at time at.
var SampleAt func(ctx context.Context, h any, at time.Time) error
