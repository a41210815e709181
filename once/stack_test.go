package once_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/once"
)

func compose(stack []message.HandlerMiddleware, h message.HandlerFunc) message.HandlerFunc {
	for i := len(stack) - 1; i >= 0; i-- {
		h = stack[i](h)
	}
	return h
}

func TestStackConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := once.Stack(once.StackConfig{})
	require.ErrorContains(t, err, "Middleware is required")
	e := newEnv(t, once.Config{})
	_, err = once.Stack(once.StackConfig{Middleware: e.mw, PoisonTopic: "p"})
	require.ErrorContains(t, err, "PoisonPublisher")
}
