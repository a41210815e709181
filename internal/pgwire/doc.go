// Package pgwire is the PostgreSQL wire-protocol wrapper around every connection of a pool
// from pgtx.Open: lazy BEGIN (the BEGIN travels with the transaction's first statement),
// deferred statements (DeferredPrefix: they travel with the next statement) and the commit
// guard on the wire (GuardOpen, GuardClose: a COMMIT or ROLLBACK user code sends in a
// transaction the library lent it is refused, and the connection refuses the rest of the
// attempt). It works below pgx, so the transaction stays a plain *sql.Tx of pgx's stdlib
// driver. Only the library's own packages use it (pgtx.Open wraps the connections,
// internal/txguard and the components send the markers); users see it as pgtx.PoolConfig's
// DisableLazyBegin and RoundTrips.
package pgwire
