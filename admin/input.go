package admin

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxConsumerBytes is the longest consumer name the components accept (once.Config,
// inbox.ReceiverConfig), so a longer one can match no rows.
const MaxConsumerBytes = 255

// The input rules below are shared by the HTTP API (answered 400) and `wmonce` (exit 2). They
// reject, before any query, what PostgreSQL would refuse as text and report as a server error.

// CheckText reports why value, given as the parameter named param, cannot be sent to
// PostgreSQL as text: a NUL byte (text cannot hold one) or invalid UTF-8. It returns nil for
// usable text, including "".
func CheckText(param, value string) error {
	switch {
	case strings.IndexByte(value, 0) >= 0:
		return fmt.Errorf("%s must not contain NUL bytes (PostgreSQL text cannot hold them)", param)
	case !utf8.ValidString(value):
		return fmt.Errorf("%s must be valid UTF-8", param)
	}
	return nil
}

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

// checkTexts runs CheckText over several values of one parameter.
func checkTexts(param string, values []string) error {
	for _, v := range values {
		if err := CheckText(param, v); err != nil {
			return err
		}
	}
	return nil
}

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
