package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
)

// The two lines watermill-sql logs when a subscription ends are logged at Debug; any other error
// stays an error, also through With.
func TestQuietCancelLogsTheEndOfASubscriptionAtDebug(t *testing.T) {
	t.Parallel()
	capture := watermill.NewCaptureLogger()
	l := quietCancel{capture}.With(watermill.LogFields{"topic": "t"})
	// As watermill-sql wraps them (subscriber.go, backoff_manager.go).
	canceled := fmt.Errorf("could not query message: %w", context.Canceled)
	l.Error("Error querying for message", canceled, nil)
	l.Error("could not rollback tx for querying message", errors.New("conn closed"), watermill.LogFields{"query_err": canceled})
	require.Empty(t, capture.Captured()[watermill.ErrorLogLevel])
	require.Len(t, capture.Captured()[watermill.DebugLogLevel], 2)

	real := errors.New("relation does not exist")
	l.Error("Error querying for message", real, nil)
	l.Error("could not rollback tx for querying message", errors.New("conn closed"), watermill.LogFields{"query_err": real})
	require.Len(t, capture.Captured()[watermill.ErrorLogLevel], 2)
}
