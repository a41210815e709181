package once

import (
	"fmt"
	"time"

	wmonce "github.com/wmonce/watermill-once"
)

// checkAge is the age guard, applied to fresh claims only: a copy whose key still exists is a
// plain duplicate, whatever its age.
func (e *Middleware) checkAge(d *delivery) error {
	if e.config.MaxMessageAge == 0 || !d.hasOccurredAt {
		return nil
	}
	age := e.config.Now().Sub(d.occurredAt)
	if age <= e.config.MaxMessageAge {
		return nil
	}
	d.counters.tooOld.Add(1)
	err := wmonce.Permanent(fmt.Errorf("%w: event occurred %s ago (at %s), beyond MaxMessageAge %s: its key may already have been deleted by retention, so applying it could apply it twice",
		wmonce.ErrTooOld, age.Round(time.Second), d.occurredAt.Format(time.RFC3339), e.config.MaxMessageAge))
	e.logger.Error("ALERT: copy older than the retention window refused, not applied", err, d.fields)
	return err
}
