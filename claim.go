package wmonce

import "context"

type claimKey struct{}

type claim struct{ consumer, key string }

// ClaimFromContext returns the consumer name and dedupe key under which the middleware claimed
// the message being handled. Code that derives keys for effects outside the database (see
// package idemkey) uses them so that its keys follow the dedupe key exactly, whatever Consumer
// and Key are configured.
func ClaimFromContext(ctx context.Context) (consumer, key string, ok bool) {
	c, ok := ctx.Value(claimKey{}).(claim)
	return c.consumer, c.key, ok
}

// ContextWithClaim records the consumer and key a message was claimed under. The middleware
// and the inbox processor set it for handlers; custom consumers may too.
func ContextWithClaim(ctx context.Context, consumer, key string) context.Context {
	return context.WithValue(ctx, claimKey{}, claim{consumer, key})
}
