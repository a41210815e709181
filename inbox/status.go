package inbox

// Status is the state of an inbox row.
type Status string

const (
	// StatusPending rows wait for a worker; next_attempt_at says from when.
	StatusPending Status = "PENDING"
	// StatusInProgress rows are claimed by a worker whose lease has not been reaped yet.
	StatusInProgress Status = "IN_PROGRESS"
	// StatusDone rows were applied; they are the dedupe record of their message.
	StatusDone Status = "DONE"
	// StatusFailed rows are parked: attempt limit reached or permanent error. With an ordering
	// key they hold back the later rows of that key until replayed or skipped.
	StatusFailed Status = "FAILED"
	// StatusSkipped rows were set aside by an operator; they count as finished for ordering and
	// stay as dedupe records.
	StatusSkipped Status = "SKIPPED"
)

func (s Status) valid() bool {
	switch s {
	case StatusPending, StatusInProgress, StatusDone, StatusFailed, StatusSkipped:
		return true
	}
	return false
}
