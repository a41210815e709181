package pgtx

import (
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// identifierPattern is deliberately narrower than what PostgreSQL accepts: lower-case ASCII
// letters, digits and underscores, starting with a letter or underscore, at most 63 bytes
// (NAMEDATALEN-1, beyond which PostgreSQL silently truncates and two names could collide).
// Mixed case is refused because an unquoted reference elsewhere would fold it and miss.
var identifierPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateIdentifier checks a configurable schema or table name. The error says what to change.
func ValidateIdentifier(kind, name string) error {
	if name == "" {
		return fmt.Errorf("%s name is empty", kind)
	}
	if !identifierPattern.MatchString(name) {
		return fmt.Errorf("%s name %q is not allowed: use 1-63 lower-case letters, digits and underscores, starting with a letter or underscore", kind, name)
	}
	return nil
}

// QuoteIdentifier quotes name as a PostgreSQL identifier (reserved words such as "user" work).
func QuoteIdentifier(name string) string {
	return pgx.Identifier{name}.Sanitize()
}

// QualifiedName returns "schema"."name", both quoted.
func QualifiedName(schema, name string) string {
	return pgx.Identifier{schema, name}.Sanitize()
}

// DefaultSchema is the PostgreSQL schema that holds watermill-once's tables unless configured
// otherwise.
const DefaultSchema = "wmonce"
