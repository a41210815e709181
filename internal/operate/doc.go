// Package operate is the operations layer that `wmonce` (cmd/wmonce) and the admin page
// (ops/admin) share: the reads they show (schema status, consumers, inbox, outbox, claims,
// failure groups), the checks of an operator's request, and the one place where each
// failure-group action is decided (ActOnFailureGroup over the owners' operations in inbox and
// outbox). It holds no SQL of its own against a table: every row it reads or changes goes
// through the table's owner. Its types are the admin API's JSON; the field names are the
// page's contract and stay stable.
//
// It is internal so that the admin package's public API is what a user embeds (the Handler,
// its Config, NewHandler), not the CLI's service layer.
package operate
