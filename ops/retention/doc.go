// Package retention deletes what watermill-once no longer needs: expired claims, finished
// inbox rows, relayed outbox rows and, when asked, stored HTTP responses, rejected outbox rows
// and SENT intents; in batches of short transactions, by one instance at a time, each cut-off
// by the database clock. Every delete is the table owner's operation (once.PruneClaims,
// inbox.PruneFinished, outbox.Prune, ...): retention decides when rows go, never how.
//
// Guarantees and limits: a claim or finished inbox row is what recognises a redelivered copy,
// and it is kept at least its consumer's Keep after it was applied. A copy arriving later is
// applied again, unless the middleware's age guard (once.Config.MaxMessageAge, a little below
// Keep) refuses it: declare each consumer's RedeliveryHorizon and NewJanitor warns about every
// Keep shorter than it. Outbox rows go only once every relay of their source forwarded them;
// PENDING, IN_PROGRESS and FAILED inbox rows and unfinished intents never go.
//
// What a round deletes, table by table, and sizing: docs/operations.md, Retention and sizing.
package retention
