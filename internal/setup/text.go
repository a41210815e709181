package setup

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// The one text rule and the dedupe-key rule every component applies, in one place so that what
// one component accepts and stores, every other one accepts and can store again.

// MaxNameLength is the longest name (consumer, relay, channel) any component accepts.
const MaxNameLength = 255

// IsText reports whether PostgreSQL's text type can store s byte for byte: valid UTF-8 without
// NUL. Every component checks what it writes to a text or JSON column with it, so one rule holds
// everywhere: what one component stores, every other one can read and store again.
func IsText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// CheckText returns an error naming what (a parameter, a field) for the first of values that
// PostgreSQL text cannot store, saying why: a NUL byte or invalid UTF-8. "" is text.
func CheckText(what string, values ...string) error {
	for _, s := range values {
		switch {
		case strings.IndexByte(s, 0) >= 0:
			return fmt.Errorf("%s must not contain NUL bytes (PostgreSQL text cannot hold them), got %.64q", what, s)
		case !utf8.ValidString(s):
			return fmt.Errorf("%s must be valid UTF-8 (PostgreSQL text cannot hold anything else), got %.64q", what, s)
		}
	}
	return nil
}

// CheckName applies the rules for a name stored as text (a consumer, a relay, a channel): not
// blank, at most MaxNameLength bytes, and text PostgreSQL can store (CheckText). Components
// apply it when they are constructed, so a name that could never be stored fails there.
func CheckName(what, s string) error {
	switch {
	case strings.TrimSpace(s) == "":
		return fmt.Errorf("%s is blank: give a name (not empty, not only spaces)", what)
	case len(s) > MaxNameLength:
		return fmt.Errorf("%s is %d bytes long; the limit is %d", what, len(s), MaxNameLength)
	}
	return CheckText(what, s)
}

// MaxKeyLengthLimit is the largest MaxKeyLength accepted: PostgreSQL b-tree entries must stay
// well under a third of a page.
const MaxKeyLengthLimit = 1024

// DefaultMaxKeyLength is every component's MaxKeyLength when none is set.
const DefaultMaxKeyLength = 255

// CheckMaxKeyLength reports a MaxKeyLength setting outside 1 to MaxKeyLengthLimit, the range
// every component accepts.
func CheckMaxKeyLength(n int) error {
	return Between("MaxKeyLength", n, 1, MaxKeyLengthLimit)
}

// CheckKey applies the rules every dedupe key must meet: not empty, at most maxLen bytes, and
// text PostgreSQL can store (valid UTF-8, no NUL). The inbox applies the same rules.
func CheckKey(key string, maxLen int) error {
	switch {
	case key == "":
		return errors.New("key is empty")
	case len(key) > maxLen:
		return fmt.Errorf("key is %d bytes long, over MaxKeyLength (%d): raise MaxKeyLength (up to %d) or use KeyFromPayloadSHA256 / a shorter business key", len(key), maxLen, MaxKeyLengthLimit)
	}
	if err := CheckText("key", key); err != nil {
		return fmt.Errorf("%w: use KeyFromPayloadSHA256 or hex-encode it", err)
	}
	return nil
}

// IsHTTPToken reports whether s is an HTTP token (RFC 9110 5.6.2): what a header name or a
// method must be. Both HTTP components check their configured names with it.
func IsHTTPToken(s string) bool {
	return s != "" && strings.IndexFunc(s, notTokenRune) < 0
}

// notTokenRune reports a rune an HTTP token cannot hold: controls, space, non-ASCII and the
// separators.
func notTokenRune(r rune) bool {
	return r >= 0x7f || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
}
