// Package oncetest tests that a user's own handler stays effectively-once when the broker,
// the network and the process misbehave: a kit imported in the application's tests, on the
// application's PostgreSQL.
//
// It finds the handler bugs that break the guarantee and pass a test delivering each message
// once: a write through the pool instead of the lent transaction, a handler that commits it,
// an effect a rollback does not undo (memory, an outside system), an output published instead
// of returned, a lost update from a read outside the transaction, an order-dependent effect.
//
// # What it does
//
// Kit.Check first delivers each event once, in order: the reference effect. Then, for every
// Mode and every Fault, it clears the handler's state (Config.Reset), delivers the events
// through the library's real middleware (once.Stack, the inbox, a real watermill-sql
// subscriber) with the fault injected, reads the effect (Config.Effect) and compares it with
// the reference. Each run has a consumer name of its own.
//
// An event the handler refuses on the clean delivery with wmonce.Permanent (a payload it cannot
// decode, as in the README's Quick start) is logged and expected refused in every other run
// too; refusing an event that applies cleanly once is a violation, and so is a panic.
//
// A violation is reported with t.Errorf: the mode, the schedule in words (shrunk to one event
// when it still fails there), what was seen, the effect beside the reference, the handler's
// last error, a hint, and the seed that replays it (ONCETEST_SEED=<seed> go test -run <test>).
// Numbers compare as numbers, lists, maps and comma-separated text as multisets. A handler's
// own ack is caught in every mode, and so is a publish on Kit.Publisher. docs/testkit.md says
// what each hint means and how each fault is made (deterministically, inside the middleware's
// transaction, at the delivery the seeded schedule names).
//
//	func TestRewardsHandler(t *testing.T) {
//		kit := oncetest.New(t, oncetest.Config{
//			DB: db, Schema: "wmonce", // migrate applied
//			Events: func() []*message.Message { return paymentsFixture() },
//			Reset:  func(ctx context.Context, db *sql.DB) error { _, err := db.ExecContext(ctx, `TRUNCATE cashback_credits`); return err },
//			Effect: func(ctx context.Context, db *sql.DB) (any, error) { return countCredits(ctx, db) },
//		})
//		kit.Check(t, rewardsHandler)
//	}
//
// # Where it stops
//
// The kit proves the handler against the schedules it runs, not against every schedule: a
// passing run says none of these faults breaks it. The seed fixes the schedule (which event a
// fault hits, the order of reordered events); it cannot fix how the Go scheduler and
// PostgreSQL interleave concurrent deliveries, which is why the kit forces the interleavings
// that matter (a shared group-commit transaction) instead of hoping for them. Effects outside PostgreSQL are seen only
// through what Config.Effect reads (count the calls a fake makes). Config.Effect must read
// through the pool the committed state, and Reset must clear all of it. The SQL subscriber
// delivers one message at a time, so concurrent schedules run one after the other in that
// mode. Reordered events are a violation only for handlers whose effect
// should not depend on arrival order: leave FaultReorder out of Config.Faults for one whose
// effect rightly does (and that refuses stale events another way). The kit sees a handler's
// ack only on the message it gave the handler and only when the handler returns: an ack from a
// goroutine that outlives the handler is not seen.
package oncetest
