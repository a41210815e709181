package setup_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/setup"
)

// textCases are the strings every component must judge alike: the rule is one, so a name the
// middleware accepts is one the inbox accepts too.
var textCases = []struct {
	name    string
	s       string
	isText  bool
	textErr string // what CheckText says, "" when it accepts
	nameErr string // what CheckName says, "" when it accepts
}{
	{"plain", "payments", true, "", ""},
	{"unicode", "paiements-été-支払い", true, "", ""},
	{"empty", "", true, "", "is blank"},
	{"spaces", "  \t", true, "", "is blank"},
	{"NUL inside", "pay\x00ments", false, "must not contain NUL bytes", "must not contain NUL bytes"},
	{"NUL alone", "\x00", false, "must not contain NUL bytes", "must not contain NUL bytes"},
	{"invalid UTF-8", "pay\xffments", false, "must be valid UTF-8", "must be valid UTF-8"},
	{"truncated rune", "caf\xc3", false, "must be valid UTF-8", "must be valid UTF-8"},
	{"surrogate half", "\xed\xa0\x80", false, "must be valid UTF-8", "must be valid UTF-8"},
	{"longest name", strings.Repeat("n", setup.MaxNameLength), true, "", ""},
	{"name one byte too long", strings.Repeat("n", setup.MaxNameLength+1), true, "", "256 bytes long; the limit is 255"},
}

func TestTextRule(t *testing.T) {
	t.Parallel()
	for _, c := range textCases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.isText, setup.IsText(c.s))
			check(t, setup.CheckText("consumer", c.s), c.textErr)
			check(t, setup.CheckName("consumer", c.s), c.nameErr)
		})
	}
	t.Run("CheckText reports the first bad value of several", func(t *testing.T) {
		require.NoError(t, setup.CheckText("message", "a", "", "b"))
		require.NoError(t, setup.CheckText("message"))
		err := setup.CheckText("message", "a", "b\xff", "c\x00")
		require.ErrorContains(t, err, "message must be valid UTF-8")
	})
}

// TestTextRuleMatchesPostgreSQL checks the rule against the server: PostgreSQL stores exactly
// the strings IsText accepts.
func TestTextRuleMatchesPostgreSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: this test needs PostgreSQL (see internal/pgtest)")
	}
	t.Parallel()
	db := pgtest.DB(t)
	for _, c := range textCases {
		var got string
		err := db.QueryRow(`SELECT $1::text`, c.s).Scan(&got)
		if c.isText {
			require.NoError(t, err, c.name)
			require.Equal(t, c.s, got, c.name)
		} else {
			require.Error(t, err, c.name)
		}
	}
}

func check(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		require.NoError(t, err)
		return
	}
	require.ErrorContains(t, err, want)
	require.ErrorContains(t, err, "consumer")
}

// Keys follow the same text rule as names, with their own length limit.
func TestCheckKeyAppliesTheTextRule(t *testing.T) {
	t.Parallel()
	require.NoError(t, setup.CheckKey("pay-1", 10))
	require.ErrorContains(t, setup.CheckKey("", 10), "key is empty")
	require.ErrorContains(t, setup.CheckKey("pay-1234567", 10), "over MaxKeyLength (10)")
	require.ErrorContains(t, setup.CheckKey("pay\x001", 10), "key must not contain NUL bytes")
	require.ErrorContains(t, setup.CheckKey("pay\xff1", 10), "key must be valid UTF-8")
}

func TestIsHTTPToken(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"Idempotency-Key", "X-Api-Key", "POST", "a!#$%&'*+.^_`|~1"} {
		require.True(t, setup.IsHTTPToken(s), s)
	}
	for _, s := range []string{"", "Idempotency Key", "Key:", "Ké", "a\x7f", "a\tb", `a"b`, "a/b", "{x}"} {
		require.False(t, setup.IsHTTPToken(s), s)
	}
}
