// Package intent records external effects (an SMS, an e-mail, a provider call) in the
// handler's transaction and sends them afterwards from a small state machine.
//
// Guarantees and limits: Store.Record inserts one row per (channel, intent key) in the
// handler's transaction (ON CONFLICT DO NOTHING), so the intent exists exactly once, and only
// if the handler's other writes committed. The Sender sends it afterwards, at least once: the
// move to SENDING commits before the provider call, and an intent whose sender died mid-call
// goes to the channel's CrashPolicy once its lease runs out (Reconcile: exactly once when the
// provider's lookup is reliable; Resend: exactly once when the provider honours the
// idempotency key, idemkey.Derive(consumer, event id, step); Skip: at most once). Every state
// change of a claimed row is fenced by its claim token, so a sender whose lease ran out cannot
// overwrite the outcome recorded by the one that took over. Without provider help the window
// of doubt is one provider call: the state machine shrinks it but cannot close it. FAILED and
// SKIPPED intents stay until an operator requeues them.
//
// The state machine, the crash policies, the keys and the tracing: docs/effects.md, Intents.
package intent
