// Package oncetype holds what every watermill-once component shares, and nothing else: dedupe
// keys and their rules, permanent errors and recovered panics, the claim carried in a handler's
// context, and the one rule for text that PostgreSQL can store. It plays the part rivertype
// plays in River: the components (once, inbox, intent, idemkey, versioned, httpidem) import
// it, never each other, for these types.
//
// It has no state, opens no connection and guarantees nothing by itself; the components that
// use it say what they guarantee.
package oncetype
