package once

// GroupCommitTestSignals initialises the test signals of mw's group committer and returns them:
// a delivery queued (with the queue's length), a group committed (with its size), a delivery
// isolated (with its key). Call it before mw handles a message.
func GroupCommitTestSignals(mw *Middleware) *groupCommitTestSignals {
	mw.group.testSignals.Init()
	return &mw.group.testSignals
}
