// Package versioned applies events to an entity in version order: a dedupe key says whether
// an event was applied, not whether it arrived in the right order.
//
// Versions keeps the last applied version of each entity (type, id) in entity_versions.
// ApplyDelta (events that describe a change) applies version v only when v-1 is stored: an
// applied version is Stale, one further ahead a retryable *GapError (ErrVersionGap).
// ApplyState (events that carry the whole state) applies anything newer than stored and skips
// the rest as Stale, so state never goes backwards.
//
// Guarantees and limits: both run in the caller's transaction (the handler's *sql.Tx): the
// version row is checked, moved and locked, then apply runs, and both commit or roll back
// together. Two transactions on one entity serialise on its row: exactly one applies a given
// version. Ordering holds per entity only, for versions the producer assigns (64-bit, one
// sequence per entity from 1, or 0 with StartAtZero). Invalid input is a permanent ErrInvalid,
// never retried. apply must not end the transaction (a permanent error wrapping
// wmonce.ErrHandlerEndedTx). A version that never arrives blocks its entity's deltas until an
// operator publishes it or calls SetVersion. More: docs/effects.md, Versioned writes.
package versioned
