// Package kithook hands package oncetest what the effectively-once middleware keeps to itself,
// so that the test kit can force the interleavings it needs without a public API for them.
// Package once sets the functions when it is linked; nothing else calls them.
package kithook

// GroupCommitQueued returns how many deliveries of mw, a *once.Middleware, wait for a
// group-commit lane now (0 without group commit).
var GroupCommitQueued func(mw any) int
