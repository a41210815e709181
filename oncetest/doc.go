// Package oncetest tests that a user's own handler stays effectively-once when the broker,
// the network and the process misbehave: a kit imported in the application's tests, on the
// application's PostgreSQL.
//
// The bugs that break the guarantee in practice live in handler code, not in the library: a
// write through the pool instead of the transaction the middleware lends (it commits on its
// own and repeats on every redelivery), a handler that commits that transaction, an effect in
// memory or in an outside system that the rollback of a failed attempt does not undo, an output
// published with the router's publisher instead of returned, a value read outside the
// transaction and written back (a lost update when events overlap), an effect that depends on
// arrival order. A handler with one of them passes a test that delivers each message once.
//
// # What it does
//
// Kit.Check first delivers each event once, in order, in a transaction of its own: the
// reference effect. Then, for every mode (Mode: own transaction, group commit, watermill-sql's
// subscriber transaction, the inbox) and every fault (Fault: sequential and concurrent copies,
// concurrent events, a transient failure and retry, the connection killed mid-handler and
// during COMMIT, a router shutdown mid-handler, reordered events, failing group-commit
// neighbours), it clears the handler's state (Config.Reset), delivers the events through the
// library's real middleware (once.New and once.Stack, the inbox Receiver and Processor, a real
// watermill-sql subscriber) with the fault injected, reads the effect (Config.Effect) and
// compares it with the reference. Each run uses a consumer name of its own, so claims of one
// run never hide the next run's deliveries.
//
// An event the handler refuses on the clean delivery with wmonce.Permanent (a payload it cannot
// decode, as in the README's Quick start) is logged and expected refused in every other run
// too; refusing an event that applies cleanly once is a violation, and so is a panic.
//
// A violation is reported with t.Errorf: the mode, the schedule in words (which event, which
// delivery, which fault; a fault that hits one event is shrunk to that event alone when it
// still fails there), what was seen, the effect observed and the reference effect, the last
// error the handler returned (else the last failed delivery's), what such a result usually
// means in handler code, and the seed with the command that replays it
// (ONCETEST_SEED=<seed> go test -run <test>). The hint follows what was seen, not the fault's
// name: an early ack (the handler acked or nacked the message it was given), a transaction the
// handler ended, a publish on the router's publisher, a delivery that never succeeded (on the
// clean delivery itself, or only after a fault), a refusal the clean delivery did not make, an
// effect more than the reference (a duplicate or a rolled-back attempt left something behind),
// less (a lost update, a skipped event), or different (order, clock, state outside the
// transaction), and outputs missing or extra. Numbers compare as numbers; lists, maps and text
// of comma-separated items as multisets of items; other values number by number, so an effect
// is best a count or a snapshot of rows.
//
// The handler's own ack is caught in every mode: the kit looks at the message the handler got
// (msg.Acked, msg.Nacked) when it returns, whether or not that ack reached the broker.
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
// A handler that takes a publisher gets Kit.Publisher in the test: a message published on it
// during a delivery is reported.
//
// # How faults are made
//
// Every fault is deterministic: the kit wraps the handler inside the middleware, where the
// transaction is open and the claim taken, and acts on the delivery the seeded schedule names.
// A transient failure is an error returned after the handler returned. The connection is
// killed mid-handler with pg_terminate_backend(pg_backend_pid()) in the lent transaction, and
// during COMMIT by a row in the kit's table oncetest_commit_fault (created in Config.Schema)
// whose deferred constraint trigger terminates its own backend while PostgreSQL commits. A
// shutdown cancels the message context, as Router.Close does (the inbox: closes the
// Processor), and delivers the message again. The kit sets once.Config.ShutdownGrace per mode
// so that the shutdown takes both paths of a closing router: 2s in a transaction of its own
// (the cancelled handler commits within the grace; its copy, delivered again, must be
// skipped), -1 with group commit (the attempt is rolled back at once; the copy delivered again
// must apply); the inbox Processor gets ShutdownGrace 2s; in watermill-sql's subscriber
// transaction the grace has no effect (the subscriber's context ends the transaction). With
// group commit, the kit holds every lane with blocking messages until the events of the
// schedule wait in the queue, so they share one transaction.
//
// A copy that fails is delivered again, as a broker would, up to 20 times, and then reported
// with its last error. One at a time it comes back at once (as on a Kafka partition), except
// under FaultReorder: there it goes behind the other events (as a broker requeues it; in the
// SQL subscriber mode the kit publishes it again at the end of the topic), so an event that
// waits for an earlier one (effects/versioned ApplyDelta's gap error) lets that one through.
//
// The SQL subscriber mode stores payloads as bytes (a BYTEA column) and UUIDs as text, so any
// message the library takes, JSON or not, goes through every mode. A mode the kit cannot run (a setup
// error) is reported with t.Errorf and the other modes still run.
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
