// Package versioned applies events to an entity in version order: a dedupe key says whether an
// event was applied, not whether it arrived in the right order, and "SET status = 'PAID'"
// replayed after a later "REFUNDED" is idempotent and still wrong.
//
// Versions keeps the last applied version of each entity (entity type, entity id) in the
// entity_versions table and offers two rules, chosen by the kind of event:
//
//   - ApplyDelta, for events that describe a change ("add 100"): applies version v only when
//     the stored version is v-1. A copy of an applied version is skipped (Stale). A version
//     further ahead returns a *GapError (errors.Is ErrVersionGap): the missing version has not
//     arrived yet, so the message must be retried later; the error is not permanent, so the
//     effectively-once stack nacks it and the broker redelivers it.
//   - ApplyState, for events that carry the whole new state: applies any version above the
//     stored one and skips (Stale) anything not newer, so old copies can be acknowledged and
//     dropped and no state ever goes backwards.
//
// Both run inside the caller's transaction (pass the *sql.Tx of the effectively-once handler,
// pgtx.TxFromContext): the version row is checked, moved and locked first, then apply runs,
// and both commit or roll back together. If apply returns an error, return it from the handler
// so the whole transaction rolls back; committing after a failed apply would record a version
// whose effect is missing. Nor may apply call Commit or Rollback on the transaction: in a
// transaction the library lent (a handler's), the attempt guard refuses such a COMMIT, so
// nothing is applied, and ApplyDelta and ApplyState return a permanent error wrapping
// wmonce.ErrHandlerEndedTx, which the library parks; they return it too when the transaction
// had ended before the call. This is checked when tx is a *sql.Tx (on a pool from pgtx.Open at
// no cost: the check travels with the transaction's next statement); other pgtx.Executor types are
// taken as still open.
//
// # Guarantees and limits
//
// Two transactions applying to one entity serialise on its version row: exactly one applies a
// given version, the other sees it as Stale (or, for a delta that is now next in line, as a gap
// that a retry resolves). Ordering holds per entity only. Versions must be assigned by the
// producer, one sequence per entity, starting at 1 (or 0 with Config.StartAtZero); a version
// below it is refused as a permanent error. Versions are 64-bit throughout (the column is
// bigint, every query binds the version as bigint), so Unix timestamps in milliseconds or
// nanoseconds serve as versions. Entity types and ids that PostgreSQL text cannot hold (NUL
// bytes, invalid UTF-8) or longer than 1024 bytes are refused as permanent ErrInvalid errors
// before any query, so such a message is not retried forever. A delta stream with a permanently missing version
// blocks that entity: its messages keep being retried, which is visible as a growing retry
// count and, with the Stack, as parked messages; resolve it by publishing the missing event or
// by setting the stored version (SetVersion) deliberately.
//
// The table is ours; if your entity table already has a version column, the same rules are a
// conditional UPDATE on it (WHERE version = $v - 1 for deltas, WHERE version < $v for state).
package versioned
