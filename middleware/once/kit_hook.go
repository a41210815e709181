package once

import "github.com/wmonce/watermill-once/internal/kithook"

func init() {
	kithook.GroupCommitQueued = func(mw any) int {
		e := mw.(*Middleware)
		if e.group == nil {
			return 0
		}
		return e.group.lanes.Queued()
	}
}
