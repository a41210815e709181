package once

// OnGroupQueued makes mw's group committer call f with the number of deliveries waiting each
// time one joins the queue, so that tests can build a group deterministically.
func OnGroupQueued(mw *Middleware, f func(waiting int)) { mw.group.onQueued = f }
