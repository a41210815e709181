package operate

import (
	"errors"
	"fmt"
)

// inputError is a mistake in a request that its caller must fix: the admin API answers it
// 400, `wmonce` exits 2 (usage).
type inputError struct{ msg string }

func (e *inputError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &inputError{msg: fmt.Sprintf(format, args...)}
}

// IsInputError reports whether err is a mistake in the input of an operation, which the
// caller must fix (the API answers it 400, `wmonce` exits 2).
func IsInputError(err error) bool {
	var ie *inputError
	return errors.As(err, &ie)
}

// inputIf is an input error saying what format says when bad holds, else nil: the checks of
// a request, listed in the order FirstError reads them.
func inputIf(bad bool, format string, args ...any) error {
	if bad {
		return badRequest(format, args...)
	}
	return nil
}

// inputErr makes the first failed input rule (CheckText, CheckConsumer, ...) an input error.
func inputErr(errs ...error) error {
	if err := FirstError(errs...); err != nil {
		return badRequest("%v", err)
	}
	return nil
}
