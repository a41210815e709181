package idemkey_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/idemkey"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
)

// Inside the middleware, keys follow the claimed consumer and dedupe key even when both are
// configured away from the defaults (handler name, UUID).
func TestKeyFollowsTheMiddlewaresClaim(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	mw, err := once.New(db, once.Config{
		Schema: schema, Consumer: "rewards", Key: wmonce.KeyFromMetadata("event_id"),
	}, nil)
	require.NoError(t, err)
	var got string
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		var err error
		got, err = idemkey.ForMessage(msg, "sms")
		return nil, err
	})
	msg := message.NewMessage("transport-7", nil)
	msg.Metadata.Set("event_id", "e-91")
	_, err = h(msg)
	require.NoError(t, err)
	want, err := idemkey.Derive("rewards", "e-91", "sms")
	require.NoError(t, err)
	require.Equal(t, want, got)
}
