// Package httpidem is an HTTP server middleware that makes POST and PATCH endpoints safe to
// retry: a client sends an Idempotency-Key header, the first request with that key runs, and
// every retry gets the first response back instead of running again. It follows the semantics
// of Stripe's idempotent requests and of the IETF Idempotency-Key header draft, and keeps its
// records in the same PostgreSQL as the application.
//
// # Behaviour
//
//   - Keys are scoped per client (Config.Scope; by default a hash of the Authorization
//     header), so two clients that choose the same key never see each other's responses.
//   - The first request runs with a *sql.Tx in its context (pgtx.TxFromContext). Its status,
//     headers and body are captured and stored in that transaction, so they commit together
//     with everything the handler wrote through the transaction, including outbox messages.
//     The response is written to the client only after the commit: a client never sees a
//     2xx for work that was rolled back.
//   - The middleware commits that transaction, never the handler: while the handler runs, the
//     schema's attempt guard (migrations 010 and 011) refuses any COMMIT. A handler that calls
//     Commit or Rollback on the transaction from its context applies nothing; the request is
//     answered 500 with the problem type ProblemHandlerEndedTx, logged as an error and counted
//     (Counters.HandlerEndedTx), and its key is not stored: a retry gets the same answer, never
//     an effect. The same holds for requests without a key under AllowMissingKey.
//   - A retry with the same key and the same request (method, path and query, body, and the
//     headers listed in Config.FingerprintHeaders) gets the stored status, headers and body,
//     byte for byte, plus the header "Idempotent-Replayed: true". An empty body (204, an empty
//     202, a handler that writes nothing and so answers 200) is stored and replayed empty.
//   - The same key with a different request: 422 Unprocessable Content.
//   - The same key while the first request still runs (on any instance): 409 Conflict with
//     Retry-After. The running request holds a transaction-level advisory lock on (scope, key)
//     for its whole transaction; concurrent requests try that lock without waiting.
//   - A missing key on a method that requires one: 400 with an application/problem+json body.
//     Invalid keys (longer than Config.MaxKeyLength, non-printable characters, several values)
//     are 400 as well; bodies over Config.MaxRequestBytes are 413.
//   - 5xx responses are not stored by default: the transaction is rolled back, the key stays
//     free and the client's retry runs afresh. With Config.StoreServerErrors they are stored
//     and replayed like any other response (Stripe's choice).
//   - Keys expire after Config.Retention (default 24 hours): an older record counts as absent,
//     and a retry after that runs as a new request. Prune removes old records.
//
// Methods not in Config.Methods (GET, PUT, DELETE by default) pass through untouched: they are
// idempotent by definition and get no transaction from this middleware.
//
// # Guarantees and limits
//
// Exactly one request per (scope, key) commits its effects, provided the handler writes them
// through the transaction in the request context. Writes made any other way (another
// connection, an external API) are not covered: a failed commit after them leaves them in
// place while the client's retry runs the handler again. Give external calls a downstream key
// (package idemkey) or record them as intents (package intent).
//
// Nothing is stored until the commit, so a process that crashes mid-request leaves no
// "in progress" record behind that could lock the key: its transaction and advisory lock end
// with its connection, and the retry runs afresh. The price is that each request under the
// middleware holds one database connection and one open transaction while its handler runs:
// size the pool for the number of concurrent requests, keep handlers short (a long transaction
// also delays the outbox relay), and do slow external work outside, behind intents.
//
// Responses are buffered in memory up to Config.MaxResponseBytes; a bigger response is not
// stored and the request fails with 500 (rolled back). Streaming (Flush) and Hijack are not
// available to handlers behind this middleware. Trailers are not stored. The advisory lock
// key is a 64-bit hash of (schema, scope, key): two different keys colliding there would only
// make one of them wait (409) while the other runs.
//
// Middleware.Counters counts each outcome and StoredKeys reads the table's size and oldest row
// cheaply; package metrics exports both as wmonce_http_idempotency_* metrics.
//
// # Tracing
//
// Each request the middleware handles (Config.TracerProvider) is an "httpidem request" span:
// the child of the span in the request's context (a tracing HTTP middleware in front), else a
// server span continuing the request's traceparent header. It carries wmonce.idempotency_key,
// http.response.status_code, wmonce.replayed (a stored response was replayed; also set as
// wmonce.duplicate) and wmonce.fingerprint_mismatch (422). The handler runs under it, so
// messages it stores with outbox.Writer continue the request's trace through the relay and the
// broker. Requests of methods the middleware does not handle are not traced here.
package httpidem
