package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/wmonce/watermill-once/internal/operate"
)

// What a request may carry, checked before any endpoint reads it. encoding/json and net/url
// would otherwise change the text on the way in: json replaces bytes that are not UTF-8, and
// \u escapes of half a surrogate pair, with U+FFFD without a word, and URL.Query drops a
// parameter whose escape is malformed. An operator's reason or selector would then reach the
// database as other text than was sent, or not at all; it is refused with 400 instead.

// MaxBodyBytes is the largest JSON body a write endpoint reads; a larger one is answered 413.
const MaxBodyBytes = 1 << 20

// checkQuery refuses a query string that does not parse or holds a parameter name or value
// that is not text (CheckText), whether or not the endpoint reads that parameter.
func checkQuery(rawQuery string) error {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return badRequest("the query string is malformed: %v", err)
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		if err := operate.FirstError(operate.CheckText("a query parameter name", name), operate.CheckText(name, q[name]...)); err != nil {
			return badRequest("%v", err)
		}
	}
	return nil
}

// readBody reads a write's JSON body, at most MaxBodyBytes, and refuses it unless every string
// in it decodes to the text that was sent (checkJSONText).
func readBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, badRequest("cannot read the request body: %v", err)
	}
	if len(body) > MaxBodyBytes {
		return nil, &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("the request body is larger than %d bytes", MaxBodyBytes)}
	}
	if err := checkJSONText(body); err != nil {
		return nil, badRequest("%v", err)
	}
	return body, nil
}

// checkJSONText refuses bytes that are not UTF-8 anywhere in body, and \u escapes that stand
// for half a UTF-16 surrogate pair (a high one not followed by the escape of a low one, or a
// low one alone): neither is a character, PostgreSQL text cannot hold either, and
// encoding/json would replace both with U+FFFD. A proper pair (\ud83d\ude00) is one character
// and passes. It scans the raw bytes, so a backslash outside a string is left to the decoder,
// which refuses it as a syntax error.
func checkJSONText(body []byte) error {
	if !utf8.Valid(body) {
		i := invalidAt(body)
		return fmt.Errorf("the JSON body is not valid UTF-8 (byte %#x at offset %d, near %q): JSON text must be UTF-8, and PostgreSQL text cannot hold anything else", body[i], i, near(body, i))
	}
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		n := escapeLen(body, i)
		if n == 0 {
			return fmt.Errorf("the JSON body holds %s at offset %d (near %q), half of a UTF-16 surrogate pair without its other half: that is no character, and PostgreSQL text cannot hold it", body[i:i+6], i, near(body, i))
		}
		i += n - 1
	}
	return nil
}

// invalidAt is the offset of the first byte of body that is not UTF-8.
func invalidAt(body []byte) int {
	for i := 0; i < len(body); {
		r, size := utf8.DecodeRune(body[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(body)
}

// escapeLen is the length of the escape at body[i] (a backslash): 12 for the \u escapes of a
// surrogate pair, 6 for another \u escape, 2 for any other escape (\\, \", ...: its second
// byte starts nothing), and 0 for half a surrogate pair.
func escapeLen(body []byte, i int) int {
	u, ok := unicodeEscape(body, i)
	if !ok {
		return 2
	}
	if !utf16.IsSurrogate(u) {
		return 6
	}
	if low, ok := unicodeEscape(body, i+6); ok && utf16.DecodeRune(u, low) != unicode.ReplacementChar {
		return 12
	}
	return 0
}

// unicodeEscape reads the \uXXXX escape at body[i:].
func unicodeEscape(body []byte, i int) (rune, bool) {
	if i+6 > len(body) || body[i] != '\\' || body[i+1] != 'u' {
		return 0, false
	}
	u, err := strconv.ParseUint(string(body[i+2:i+6]), 16, 16)
	return rune(u), err == nil
}

// near returns up to 16 bytes of body either side of offset i, cut at character boundaries,
// for an error message to quote.
func near(body []byte, i int) string {
	start, end := max(0, i-16), min(len(body), i+16)
	for start < i && !utf8.RuneStart(body[start]) {
		start++
	}
	for end < len(body) && end > i && !utf8.RuneStart(body[end]) {
		end--
	}
	return string(body[start:end])
}

// decodeBody decodes the JSON body of a write (which the write guard has checked) into v.
// Unknown fields and anything after the first value are refused.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("cannot read the JSON body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("the JSON body holds more than one value: send one object")
	}
	return nil
}

// withBody returns a shallow copy of r whose body reads body: the endpoint decodes the bytes
// readBody checked.
func withBody(r *http.Request, body []byte) *http.Request {
	r = r.WithContext(r.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	return r
}
