// Package idemkey derives downstream idempotency keys and attaches them to outgoing HTTP
// requests.
//
// # Why
//
// The effectively-once middleware protects only what commits with its transaction. A call to a
// payment provider, an SMS gateway or any other HTTP API cannot join that transaction, and both
// orders fail: call then commit, and a crash in between makes the redelivery call again;
// commit then call, and the redelivery finds the message applied and never calls. The way out
// is to call first and give the other side a key it deduplicates on, the same key on every
// redelivery: then the repeated call is answered from the provider's record instead of
// repeating the effect.
//
// # Keys
//
// Derive computes the key from (consumer, message id, step): the SHA-256 of a length-prefixed
// encoding of the three parts under a version tag, written as 64 lower-case hex characters.
// Length prefixes make the encoding unambiguous ("ab"+"c" and "a"+"bc" give different keys).
// The key is identical on every redelivery of the same message to the same consumer, and
// different for every step, so one handler can make several calls ("charge", "receipt-email")
// that each deduplicate on their own. DeriveUUID formats the same hash as an RFC 9562 version 8
// UUID for providers that insist on UUID-shaped keys.
//
// Source derives the key of a message inside an effectively-once handler: the consumer name is
// the router handler name (or Source.Consumer, which must then equal the middleware's
// Config.Consumer) and the message id is the UUID (or Source.MessageID, which must then match
// the middleware's Config.Key). A key derived from different parts than the dedupe key is still
// stable, but two different events could share it.
//
// # Transport
//
// Transport is an http.RoundTripper that sets the Idempotency-Key header (or another header)
// from the key stored in the request context with WithKey. A key the caller set in the header
// wins, whatever the spelling of the header name; exactly one key is ever sent, and a header
// holding two different keys is refused (ErrConflictingKeys). It never mutates the caller's
// request (it sends a clone), and by default refuses a
// request with an unsafe method (anything but GET, HEAD, OPTIONS, TRACE) that carries no key at
// all, so a forgotten key fails loudly instead of silently losing the protection.
//
// # Guarantees and limits
//
// A key makes the external effect happen once only if the provider honours it, and only for as
// long as the provider remembers it (Stripe: at least 24 hours). A redelivery later than the
// provider's retention, or a provider that ignores the header, repeats the effect. Use the
// intent package when the provider honours no key or when the send must be tracked.
package idemkey
