// Package wmonce is the root of watermill-once: what every component shares, and nothing else:
// dedupe keys and their rules, permanent errors and recovered panics, the claim carried in a
// handler's context. The components import it, never each other, for these types (as
// Watermill's components import its root package watermill). Import it as
//
//	wmonce "github.com/wmonce/watermill-once"
//
// It has no state, opens no connection and guarantees nothing by itself; the components that
// use it say what they guarantee. The module's layers are in ARCHITECTURE.md.
package wmonce
