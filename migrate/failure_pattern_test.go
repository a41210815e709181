package migrate_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// The failure groups' rule (migrations 015 and 018): the parts of an error that differ from one
// failed message to the next are replaced, what says why it failed is kept, and the fingerprint
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

// One storm is one group however many digits its ids have (issue 34, item 5): a decimal number
// is <n> at any length; <hex> is only what holds a letter a-f and a digit, is 0x-prefixed, or has
// the shape of a UUID or a digest. The texts are errors as the clients print them.
func TestFailurePatternOfRealErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pattern := pgtx.QualifiedName(schema, "failure_pattern")
	for _, c := range []struct{ in, want string }{
		// The storm of the issue: ids of 1 to 12 digits, one pattern.
		{"account 7 is frozen", "account <n> is frozen"},
		{"account 100000 is frozen", "account <n> is frozen"},
		{"account 123456789012 is frozen", "account <n> is frozen"},
		// Kafka (franz-go, sarama).
		{"OFFSET_OUT_OF_RANGE: The requested offset is not within the range of offsets maintained by the server. (topic orders, partition 3, offset 4294967296)",
			"OFFSET_OUT_OF_RANGE: The requested offset is not within the range of offsets maintained by the server. (topic orders, partition <n>, offset <n>)"},
		{"UNKNOWN_TOPIC_OR_PARTITION: This server does not host this topic-partition.", "UNKNOWN_TOPIC_OR_PARTITION: This server does not host this topic-partition."},
		{"NOT_LEADER_OR_FOLLOWER: For requests intended only for the leader, this error indicates that the broker is not the current leader.",
			"NOT_LEADER_OR_FOLLOWER: For requests intended only for the leader, this error indicates that the broker is not the current leader."},
		{"kafka: client has run out of available brokers to talk to: dial tcp 127.0.0.1:9092: connect: connection refused",
			"kafka: client has run out of available brokers to talk to: dial tcp <addr>: connect: connection refused"},
		{"kafka: Failed to produce message to topic payments: kafka server: Message was too large, server rejected it to avoid allocation error",
			"kafka: Failed to produce message to topic payments: kafka server: Message was too large, server rejected it to avoid allocation error"},
		{"MESSAGE_TOO_LARGE: The request included a message larger than the max message size the server will accept. (record of 1048601 bytes)",
			"MESSAGE_TOO_LARGE: The request included a message larger than the max message size the server will accept. (record of <n> bytes)"},
		{"unable to dial: dial tcp 10.2.3.4:9094: i/o timeout", "unable to dial: dial tcp <addr>: i/o timeout"},
		// RabbitMQ (amqp091-go).
		{`Exception (504) Reason: "channel/connection is not open"`, `Exception (<n>) Reason: "channel/connection is not open"`},
		{`Exception (406) Reason: "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value used: 1800000 ms. This timeout value can be configured, see consumers doc guide to learn more"`,
			`Exception (<n>) Reason: "PRECONDITION_FAILED - delivery acknowledgement on channel <n> timed out. Timeout value used: <n> ms. This timeout value can be configured, see consumers doc guide to learn more"`},
		{`Exception (406) Reason: "PRECONDITION_FAILED - unknown delivery tag 1000001"`, `Exception (<n>) Reason: "PRECONDITION_FAILED - unknown delivery tag <n>"`},
		{`Exception (404) Reason: "NOT_FOUND - no queue 'orders' in vhost '/'"`, `Exception (<n>) Reason: "NOT_FOUND - no queue 'orders' in vhost '/'"`},
		{`Exception (320) Reason: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"`,
			`Exception (<n>) Reason: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"`},
		{"dial tcp 127.0.0.1:5672: connect: connection refused", "dial tcp <addr>: connect: connection refused"},
		// PostgreSQL (pgx, lib/pq).
		{`ERROR: duplicate key value violates unique constraint "orders_pkey" (SQLSTATE 23505)`,
			`ERROR: duplicate key value violates unique constraint "orders_pkey" (SQLSTATE <n>)`},
		{"ERROR: could not serialize access due to read/write dependencies among transactions (SQLSTATE 40001)",
			"ERROR: could not serialize access due to read/write dependencies among transactions (SQLSTATE <n>)"},
		{"ERROR: deadlock detected (SQLSTATE 40P01)", "ERROR: deadlock detected (SQLSTATE <n>P<n>)"},
		{"ERROR: canceling statement due to statement timeout (SQLSTATE 57014)", "ERROR: canceling statement due to statement timeout (SQLSTATE <n>)"},
		{"FATAL: terminating connection due to administrator command (SQLSTATE 57P01)", "FATAL: terminating connection due to administrator command (SQLSTATE <n>P<n>)"},
		{"ERROR: value too long for type character varying(64) (SQLSTATE 22001)", "ERROR: value too long for type character varying(<n>) (SQLSTATE <n>)"},
		{`pq: insert or update on table "payments" violates foreign key constraint "payments_account_id_fkey"`,
			`pq: insert or update on table "payments" violates foreign key constraint "payments_account_id_fkey"`},
		{"failed to connect to `host=10.0.0.5 user=app database=payments`: dial error (dial tcp 10.0.0.5:5432: connect: connection refused)",
			"failed to connect to `host=<addr> user=app database=payments`: dial error (dial tcp <addr>: connect: connection refused)"},
		// net.
		{"read tcp 10.1.2.3:54012->10.1.2.4:5432: read: connection reset by peer", "read tcp <addr>-><addr>: read: connection reset by peer"},
		{"write tcp [::1]:40522->[::1]:5672: write: broken pipe", "write tcp <addr>-><addr>: write: broken pipe"},
		{"dial tcp: lookup payments-db on 127.0.0.53:53: no such host", "dial tcp: lookup payments-db on <addr>: no such host"},
		{"dial tcp [2001:db8::1]:443: connect: network is unreachable", "dial tcp <addr>: connect: network is unreachable"},
		{"context deadline exceeded", "context deadline exceeded"},
		// HTTP.
		{`Post "https://api.example.com/v1/charges": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`,
			`Post "https://api.example.com/v<n>/charges": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`},
		{`Get "http://10.0.0.9:8080/accounts/100000": dial tcp 10.0.0.9:8080: connect: connection refused`,
			`Get "http://<addr>/accounts/<n>": dial tcp <addr>: connect: connection refused`},
		{"payment gateway: 503 Service Unavailable", "payment gateway: <n> Service Unavailable"},
		{"unexpected status 429 Too Many Requests (Retry-After: 120)", "unexpected status <n> Too Many Requests (Retry-After: <n>)"},
		{"http: server gave HTTP response to HTTPS client", "http: server gave HTTP response to HTTPS client"},
		{"trace 4bf92f3577b34da6a3ce929d0e0e4736 span 00f067aa0ba902b7: upstream returned 502",
			"trace <hex> span <hex>: upstream returned <n>"},
		// JSON (encoding/json).
		{"json: cannot unmarshal string into Go struct field Order.amount of type int64", "json: cannot unmarshal string into Go struct field Order.amount of type int<n>"},
		{"json: cannot unmarshal number 1e+21 into Go struct field Payment.cents of type int64",
			"json: cannot unmarshal number <n>e+<n> into Go struct field Payment.cents of type int<n>"},
		{"invalid character '}' looking for beginning of object key string", "invalid character '}' looking for beginning of object key string"},
		{"unexpected end of JSON input", "unexpected end of JSON input"},
		{`decode event 7f3e9a1c2b4d: json: unknown field "amout"`, `decode event <hex>: json: unknown field "amout"`},
		// Digests: hex by their shape, even the rare one drawn with decimal digits only.
		{"sha256:9f86d081884c7d659a2feaf0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 digest mismatch", "sha<n>:<hex> digest mismatch"},
		{"object 1234567890123456789012345678901234567890 missing", "object <hex> missing"},
		{"panic: runtime error: invalid memory address or nil pointer dereference [signal SIGSEGV: segmentation violation code=0x1 addr=0x18 pc=0x4a1f2c]",
			"panic: runtime error: invalid memory address or nil pointer dereference [signal SIGSEGV: segmentation violation code=<hex> addr=<hex> pc=<hex>]"},
	} {
		var got string
		require.NoError(t, db.QueryRow(`SELECT `+pattern+`($1)`, c.in).Scan(&got))
		require.Equal(t, c.want, got, "failure_pattern(%q)", c.in)
	}

	// The storm, as the failure groups see it: one fingerprint.
	fp := pgtx.QualifiedName(schema, "failure_fingerprint")
	var groups int
	require.NoError(t, db.QueryRow(`SELECT count(DISTINCT `+fp+`('inbox', 'payments', 'accounts', 'account ' || id || ' is frozen'))
FROM unnest(ARRAY[7, 42, 99999, 100000, 123456, 9999999, 123456789012]::bigint[]) AS id`).Scan(&groups))
	require.Equal(t, 1, groups, "errors that differ only in a decimal id are one group")
}
