package operate

import (
	"fmt"

	"github.com/wmonce/watermill-once/internal/setup"
)

// MaxConsumerBytes is the longest consumer name the components accept, so
// a longer one can match no rows.
const MaxConsumerBytes = setup.MaxNameLength

// The input rules below are shared by the HTTP API (answered 400) and `wmonce` (exit 2). They
// reject, before any query, what PostgreSQL would refuse as text and report as a server error.

// CheckText reports why a value of the parameter named param cannot be sent to PostgreSQL as
// text (a NUL byte or invalid UTF-8), by the rule every component applies. It
// returns nil for usable text, including "".
func CheckText(param string, values ...string) error { return setup.CheckText(param, values...) }

// CheckConsumer is CheckText plus the length limit of consumer names (MaxConsumerBytes).
// Whether an empty name is allowed is the caller's to say.
func CheckConsumer(param, name string) error {
	if err := CheckText(param, name); err != nil {
		return err
	}
	if len(name) > MaxConsumerBytes {
		return fmt.Errorf("%s is %d bytes long; the limit is %d (no consumer has a longer name)", param, len(name), MaxConsumerBytes)
	}
	return nil
}

// FirstError returns the first non-nil error.
func FirstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
