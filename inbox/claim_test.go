package inbox_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/idemkey"
	"github.com/wmonce/watermill-once/inbox"
)

// Handlers run by the processor derive downstream keys from the inbox's dedupe key, exactly as
// under the effectively-once middleware.
func testProcessorExposesClaimForDownstreamKeys(t *testing.T, batch bool) {
	t.Parallel()
	e := newEnv(t).handlers(batch)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "rewards", Key: wmonce.KeyFromMetadata("event_id")})
	msg := message.NewMessage("transport-1", []byte(`{}`))
	msg.Metadata.Set("event_id", "e-91")
	require.NoError(t, r.Handle(msg))

	keys := make(chan string, 1)
	e.start(t, func(msg *message.Message) ([]*message.Message, error) {
		k, err := idemkey.ForMessage(msg, "sms")
		keys <- k
		return nil, err
	}, inbox.ProcessorConfig{Consumer: "rewards"})
	want, err := idemkey.Derive("rewards", "e-91", "sms")
	require.NoError(t, err)
	select {
	case got := <-keys:
		require.Equal(t, want, got)
	case <-time.After(20 * time.Second):
		t.Fatal("the processor did not run the handler")
	}
}
