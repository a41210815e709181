// Package httpidem is an HTTP server middleware that makes POST and PATCH endpoints safe to
// retry (Stripe's idempotent requests, the IETF Idempotency-Key draft): the first request with
// a client's Idempotency-Key runs with a *sql.Tx in its context (pgtx.TxFromContext), and its
// response is stored in that transaction and sent only after the commit.
//
// What a repeated request gets: the same key and the same request (method, path, query, body,
// Config.FingerprintHeaders) the stored response byte for byte, with Idempotent-Replayed:
// true; a different request 422; a request while the first still runs (any instance) 409 with
// Retry-After; no key 400. Keys are scoped per client (Config.Scope) and expire after
// Config.Retention (24h): a later retry runs again. 5xx responses are rolled back and not
// stored unless Config.StoreServerErrors; a handler that ends the transaction applies nothing
// (500, ProblemHandlerEndedTx).
//
// Where that stops: exactly one request per (scope, key) commits its effects, provided the
// handler writes them through the request's transaction; other writes and external calls are
// not covered (give them an idemkey or record intents). Nothing is stored before the commit,
// so a crash leaves the key free. Each request holds a connection and a transaction while it
// runs; responses are buffered up to MaxResponseBytes, without Flush, Hijack or trailers.
//
// The behaviour in full, sizing and tracing: docs/effects.md, HTTP Idempotency-Key middleware.
package httpidem
