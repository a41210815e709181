package wmonce

import "context"

type claimKey struct{}

type claim struct{ consumer, key string }

// ClaimFromContext returns the consumer and dedupe key under which the message being handled
// was claimed, so that keys for effects outside the database (package idemkey) follow it.
func ClaimFromContext(ctx context.Context) (consumer, key string, ok bool) {
	c, ok := ctx.Value(claimKey{}).(claim)
	return c.consumer, c.key, ok
}

// ContextWithClaim records the consumer and key a message was claimed under. The middleware
// and the inbox processor set it for handlers; custom consumers may too.
func ContextWithClaim(ctx context.Context, consumer, key string) context.Context {
	return context.WithValue(ctx, claimKey{}, claim{consumer, key})
}
