// Package intent records external effects (an SMS, an e-mail, a provider call) inside the
// handler's transaction and sends them afterwards from a small state machine.
//
// # Why
//
// An effect outside the database cannot join the handler's transaction. Recording the intent
// to cause it can: Store.Record inserts one row per (channel, intent key) in the handler's
// transaction with ON CONFLICT DO NOTHING, so the intent exists exactly once, and only if the
// handler's other writes committed. Sender then works the rows:
//
//	PENDING --claim--> SENDING --provider ok--> SENT (provider id stored)
//	                      |-- rejected (Permanent) ---------> FAILED
//	                      |-- not sent (NotSent) -----------> PENDING, retried with backoff
//	                      |-- outcome unknown (other error) -> channel policy, as for a crash
//	                      '-- attempts exhausted -----------> FAILED
//
// The move to SENDING is committed before the provider is called, so a sender that dies during
// the call leaves a SENDING row behind whose lease runs out; the next sender finds it and
// applies the channel's CrashPolicy:
//
//   - Reconcile: ask the provider (Lookuper) whether it has our reference, the intent key. Found:
//     SENT with the provider's id, nothing sent again. Not found: send (with the same key).
//   - Resend: send again with the same idempotency key. Exactly one effect if the provider
//     honours the key; otherwise a duplicate is possible (acceptable for a one-time password).
//   - Skip: mark SKIPPED with the reason and log an error. The effect happened once or not at
//     all (at most once); an operator decides (Store.Requeue sends it after all).
//
// A sender that stops cleanly gives its intent back at once instead of leaving it to the lease
// (see Sender.Close); stopping never turns "maybe sent" into a silent resend.
//
// A channel whose provider implements Lookuper defaults to Reconcile; any other channel must
// choose Resend or Skip explicitly, because that choice trades duplicates against gaps and only
// the owner of the channel can make it.
//
// # Keys
//
// The intent key is idemkey.Derive(consumer, event id, step), step defaulting to the channel.
// It is the unique key of the intent row, the idempotency key the sender passes to the
// provider (in the Intent and in the context, where idemkey.Transport finds it), and the
// reference Reconcile looks up. A provider that honours it turns every resend into a replay.
//
// # Guarantees and limits
//
// Recording is exactly-once with the handler's transaction. Sending is at-least-once per intent
// with Reconcile (exactly-once when the lookup is reliable) and with Resend (exactly-once when
// the provider honours the key), at-most-once with Skip. Every state change of a claimed row is
// fenced by its claim token, so a sender whose lease ran out cannot overwrite the outcome
// recorded by the sender that took over (it logs and counts a lost lease instead). Without
// provider help the window of doubt is one provider call, never more: the state machine
// shrinks it but cannot close it.
//
// Sender.SendTimeout bounds every provider call and must stay below Lease, or a live but slow
// sender would be taken for dead and its intent sent twice. FAILED and SKIPPED rows stay in the
// table, visible to Store.Stats and Store.Backlog, and to alerting (package metrics exports
// Sender.Counters and the Backlog as wmonce_intent_* metrics), until someone requeues them.
//
// # Tracing
//
// Each take of an intent by a Sender (SenderConfig.TracerProvider) is an "intent send" span
// (kind client) with wmonce.intent.channel, wmonce.intent.key, wmonce.attempt,
// wmonce.consumer and the state reached (wmonce.outcome; wmonce.duplicate when a reconcile
// lookup found the effect already done); the provider is called with it in its context, so
// an instrumented HTTP client continues it. Store.Record and RecordTx keep the W3C trace context
// of the span in their context in the intent's row (migration 009), and the send span is its
// child, so a send joins the trace of the handler that recorded it however much later it runs
// (a span in the Sender's context of another trace is linked). Where it stops: an intent
// recorded without a span starts a trace of its own at its send.
package intent
