package httpidem

import (
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// queries are the statements on the http_idempotency_keys table of one schema.
type queries struct {
	// lock takes the key's advisory lock and opens the attempt guard as it goes (see
	// internal/txguard): from here until the middleware's own COMMIT, a COMMIT the handler
	// sends is refused. AND: the guard must open whenever the lock is taken; when it is not,
	// the transaction ends.
	lock string
	// lookup reads the live record of a key.
	lookup string
	// store writes the response. The only row it may meet is an expired one (a live one was
	// checked for under the advisory lock), which the new response replaces.
	store string
}

// With wireGuard the lock does not open the server's attempt guard: the connection guards the
// transaction (txguard.For) and the server does no work for it.
func newQueries(schema string, wireGuard bool) queries {
	t := pgtx.QualifiedName(schema, "http_idempotency_keys")
	lock := `SELECT pg_try_advisory_xact_lock($1) AND ` + txguard.Condition(schema)
	if wireGuard {
		lock = `SELECT pg_try_advisory_xact_lock($1)`
	}
	return queries{
		lock: lock,
		lookup: `SELECT fingerprint, response_status, response_headers::text, response_body, created_at FROM ` + t + `
WHERE scope = $1 AND idem_key = $2 AND created_at > now() - $3 * interval '1 microsecond'`,
		store: `INSERT INTO ` + t + ` (scope, idem_key, fingerprint, method, request_uri, response_status, response_headers, response_body)
VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8)
ON CONFLICT (scope, idem_key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, method = EXCLUDED.method,
    request_uri = EXCLUDED.request_uri, response_status = EXCLUDED.response_status,
    response_headers = EXCLUDED.response_headers, response_body = EXCLUDED.response_body, created_at = now()
WHERE ` + t + `.created_at <= now() - $9 * interval '1 microsecond'`,
	}
}
