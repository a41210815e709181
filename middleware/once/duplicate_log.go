package once

import (
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// DuplicateLogInterval is how often, at most, the middleware logs a summary of the duplicates
// it skipped for one consumer. A redelivery storm can skip thousands of copies a second: each is
// logged at debug level and counted (Counters.Duplicates, the wmonce metrics), and at info level
// only the first of a quiet spell and then one line per interval with the number since the last
// line. Duplicates whose payload differs from the applied copy's are logged at error level, each.
const DuplicateLogInterval = time.Minute

// duplicateLog summarises one consumer's skipped duplicates at info level.
type duplicateLog struct {
	mu      sync.Mutex
	last    time.Time // when the last info line was logged
	skipped uint64    // duplicates since then
}

// logDuplicate logs one skipped copy (and records it per minute: recordDuplicate): at debug
// level always, and at info level when the
// consumer's last info line is DuplicateLogInterval old (or there was none), with the number of
// duplicates it summarises.
func (e *Middleware) logDuplicate(d *delivery, msg string, fields watermill.LogFields) {
	e.recordDuplicate(d.consumer, false) // for the admin page's charts (duplicate_history.go)
	e.logger.Debug(msg, fields)
	v, _ := e.dupLogs.LoadOrStore(d.consumer, &duplicateLog{})
	l := v.(*duplicateLog)
	now := e.config.Now()
	l.mu.Lock()
	l.skipped++
	if !l.last.IsZero() && now.Sub(l.last) < DuplicateLogInterval {
		l.mu.Unlock()
		return
	}
	n, since := l.skipped, l.last
	l.last, l.skipped = now, 0
	l.mu.Unlock()
	summary := watermill.LogFields{"consumer": d.consumer, "duplicates": n}
	if since.IsZero() {
		e.logger.Info(msg+" (further duplicates of this consumer are summarised once a minute; each one is logged at debug level)", fields.Add(summary))
		return
	}
	summary["since"] = since.Format(time.RFC3339)
	e.logger.Info("Duplicates skipped since the last summary: already applied", summary)
}
