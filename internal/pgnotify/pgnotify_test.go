package pgnotify_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgnotify"
)

// PostgreSQL truncates identifiers at 63 bytes: long schema names must map to distinct
// channels that fit, short ones stay readable.
func TestChannelFitsAndStaysDistinct(t *testing.T) {
	require.Equal(t, "wmonce_outbox_app", pgnotify.Channel("wmonce_outbox_", "app"))
	a := pgnotify.Channel("wmonce_outbox_", strings.Repeat("s", 60)+"a")
	b := pgnotify.Channel("wmonce_outbox_", strings.Repeat("s", 60)+"b")
	require.LessOrEqual(t, len(a), pgnotify.MaxChannelLength)
	require.NotEqual(t, a, b)
}
