// Package retention deletes what watermill-once no longer needs: expired dedupe claims,
// finished inbox rows and relayed outbox rows, in batches of short transactions, run by one
// instance at a time. See Janitor for what it deletes and what it never touches.
package retention
