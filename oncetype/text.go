package oncetype

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxNameLength is the longest name (consumer, relay, channel, scope) any component accepts.
const MaxNameLength = 255

// IsText reports whether PostgreSQL's text type can store s: valid UTF-8 without NUL. Every
// string a component writes to a text column is checked with it, so one rule holds everywhere.
func IsText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// CheckText returns an error naming what when s cannot be stored as PostgreSQL text.
func CheckText(what, s string) error {
	if !IsText(s) {
		return fmt.Errorf("%s %q is not valid UTF-8 text or contains NUL: PostgreSQL text cannot store it", what, s)
	}
	return nil
}

// CheckName applies the rules for a name stored as text (a consumer, a relay, a channel): not
// blank, at most MaxNameLength bytes, and text PostgreSQL can store.
func CheckName(what, s string) error {
	switch {
	case strings.TrimSpace(s) == "":
		return fmt.Errorf("%s is empty or blank", what)
	case len(s) > MaxNameLength:
		return fmt.Errorf("%s is %d bytes long, over %d", what, len(s), MaxNameLength)
	}
	return CheckText(what, s)
}
