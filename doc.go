// Package wmonce is the root of watermill-once: what every component shares, and nothing else:
// dedupe keys and their rules, permanent errors and recovered panics, the claim carried in a
// handler's context, and the one rule for text that PostgreSQL can store. It plays the part the
// root package watermill plays in Watermill: the components (middleware/once, inbox, outbox,
// effects/intent, effects/idemkey, effects/versioned, middleware/httpidem) import it, never each
// other, for these types. Import it as
//
//	wmonce "github.com/wmonce/watermill-once"
//
// The layers of the module are in ARCHITECTURE.md: the middlewares (middleware/once,
// middleware/httpidem), the tables they share (outbox, inbox, migrate), the plumbing (pgtx,
// broker), effects outside the database (effects/...), and operations (ops/..., cmd/wmonce).
//
// It has no state, opens no connection and guarantees nothing by itself; the components that
// use it say what they guarantee.
package wmonce
