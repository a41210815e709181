// Package idemkey derives downstream idempotency keys and attaches them to outgoing HTTP
// requests, for effects that cannot join the handler's transaction: call first, with a key the
// other side deduplicates on, then commit.
//
// Guarantees and limits: Derive's key is a function of (consumer, message id, step) alone, so
// it is stable across redeliveries of a message to a consumer, in every process and release,
// and different per step. Inside the effectively-once middleware, ForMessage and Source derive
// it from the consumer and dedupe key the message was claimed under. Transport sends it as the
// Idempotency-Key header, exactly one key per request, and refuses an unsafe request that
// carries none. The effect happens once only if the provider honours the key, and only for as
// long as it remembers it: a later redelivery, or a provider that ignores the header, repeats
// the effect (package intent records and tracks the send instead).
//
// The key's encoding, the transport's header rules and watermill-http: docs/effects.md.
package idemkey
