package migrate_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// The failure groups' rule (migration 015): the parts of an error that differ from one failed
// message to the next are replaced, what says why it failed is kept, and the fingerprint
// tells kinds, owners and topics apart.
func TestFailurePatternReplacesVolatileParts(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pattern := pgtx.QualifiedName(schema, "failure_pattern")
	for in, want := range map[string]string{
		"order 3f2a9c1e-1B2C-4d5e-8f90-123456789abc not found":           "order <uuid> not found",
		"dial tcp 10.0.0.7:5432: connection refused":                     "dial tcp <addr>: connection refused",
		"dial tcp 192.168.1.20: i/o timeout after 30s":                   "dial tcp <addr>: i/o timeout after <n>s",
		"dial tcp [::1]:9092: connection refused":                        "dial tcp <addr>: connection refused",
		"dial tcp [fe80::1%eth0]:9092: refused":                          "dial tcp <addr>: refused",
		"tx deadbeef01 aborted at 0xc000123456":                          "tx <hex> aborted at <hex>",
		"card declined: insufficient funds":                              "card declined: insufficient funds",
		"invoice 4411 of customer 77 over limit 1000.50":                 "invoice <n> of customer <n> over limit <n>.<n>",
		"decided: facade cafe deadbeef (words of hex letters are words)": "decided: facade cafe deadbeef (words of hex letters are words)",
		"": "",
	} {
		var got string
		require.NoError(t, db.QueryRow(`SELECT `+pattern+`($1)`, in).Scan(&got))
		require.Equal(t, want, got, "failure_pattern(%q)", in)
	}
	var null string
	require.NoError(t, db.QueryRow(`SELECT `+pattern+`(NULL)`).Scan(&null))
	require.Empty(t, null, "a row without an error groups as the empty error")

	fp := pgtx.QualifiedName(schema, "failure_fingerprint")
	var same, otherKind, otherOwner, otherTopic bool
	require.NoError(t, db.QueryRow(`SELECT `+fp+`('inbox', 'c', 't', 'order 12 failed') = `+fp+`('inbox', 'c', 't', 'order 99 failed'),
		`+fp+`('inbox', 'c', 't', 'x') = `+fp+`('rejected', 'c', 't', 'x'),
		`+fp+`('inbox', 'c', 't', 'x') = `+fp+`('inbox', 'd', 't', 'x'),
		`+fp+`('inbox', 'c', 't', 'x') = `+fp+`('inbox', 'c', 'u', 'x')`).Scan(&same, &otherKind, &otherOwner, &otherTopic))
	require.True(t, same, "errors that differ in numbers only share a fingerprint")
	require.False(t, otherKind)
	require.False(t, otherOwner)
	require.False(t, otherTopic)
}
