package httpidem

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// parseKey returns the key, whether the header was present, and an error for an unusable one.
// Both a bare token (Stripe) and a quoted Structured Field string (IETF draft) are accepted.
func (m *Middleware) parseKey(r *http.Request) (string, bool, error) {
	values := r.Header.Values(m.header)
	if len(values) == 0 {
		return "", false, nil
	}
	if len(values) > 1 {
		return "", true, fmt.Errorf("%s must appear once; it appears %d times", m.header, len(values))
	}
	v, err := m.decodeKey(strings.TrimSpace(values[0]))
	if err != nil {
		return "", true, err
	}
	switch {
	case v == "":
		return "", true, fmt.Errorf("%s is empty", m.header)
	case len(v) > m.config.MaxKeyLength:
		return "", true, fmt.Errorf("%s is %d characters long; the limit is %d", m.header, len(v), m.config.MaxKeyLength)
	}
	return v, true, nil
}

// decodeKey reads a header value as a quoted Structured Field string (the IETF draft) or a
// bare key of visible ASCII (Stripe).
func (m *Middleware) decodeKey(v string) (string, error) {
	if !strings.HasPrefix(v, `"`) {
		if strings.IndexFunc(v, notVisibleASCII) >= 0 {
			return "", fmt.Errorf("%s may contain only visible ASCII characters (or be a quoted string)", m.header)
		}
		return v, nil
	}
	s, err := unquoteSFString(v)
	if err != nil {
		return "", fmt.Errorf("%s is not a valid quoted string: %w", m.header, err)
	}
	return s, nil
}

// unquoteSFString decodes an RFC 8941 sf-string: printable ASCII between double quotes, with
// only \" and \\ as escapes.
func unquoteSFString(s string) (string, error) {
	if len(s) < 2 || s[len(s)-1] != '"' {
		return "", errors.New("missing closing quote")
	}
	var b strings.Builder
	inner := s[1 : len(s)-1]
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		switch {
		case c == '\\':
			i++
			if i == len(inner) || (inner[i] != '"' && inner[i] != '\\') {
				return "", errors.New(`only \" and \\ may be escaped`)
			}
			b.WriteByte(inner[i])
		case c == '"':
			return "", errors.New("unescaped quote inside the string")
		case c < 0x20 || c >= 0x7f:
			return "", errors.New("only printable ASCII is allowed")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// notVisibleASCII reports a rune a bare key cannot hold: controls, space and anything beyond
// ASCII (invalid UTF-8 decodes to U+FFFD and counts as beyond).
func notVisibleASCII(r rune) bool { return r <= ' ' || r >= 0x7f }
