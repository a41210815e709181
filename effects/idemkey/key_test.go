package idemkey_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/effects/idemkey"
)

func TestDeriveIsStableAndDistinct(t *testing.T) {
	t.Parallel()
	k1, err := idemkey.Derive("rewards", "e-91", "charge")
	require.NoError(t, err)
	k2, err := idemkey.Derive("rewards", "e-91", "charge")
	require.NoError(t, err)
	require.Equal(t, k1, k2, "same parts, same key: every redelivery sends the same key")
	require.Regexp(t, `^[0-9a-f]{64}$`, k1)

	// Pinned: the encoding must never change between releases, or keys sent before an
	// upgrade would not match those sent after it and the provider would repeat the effect.
	// Computed independently: sha256(uvarint(len)+bytes for "watermill-once/idemkey/v1",
	// "rewards", "e-91", "charge").
	require.Equal(t, "2adb8c7095d4bf23a9941f90b696fae598b2e49dbaf068ff6f5d10de1878d302", k1)

	seen := map[string]string{k1: "rewards/e-91/charge"}
	for _, parts := range [][3]string{
		{"rewards", "e-91", "receipt"}, // another step
		{"rewards", "e-92", "charge"},  // another message
		{"billing", "e-91", "charge"},  // another consumer
		{"rewardse", "-91", "charge"},  // same concatenation, different split
		{"rewards", "e-9", "1charge"},
	} {
		k, err := idemkey.Derive(parts[0], parts[1], parts[2])
		require.NoError(t, err)
		prev, dup := seen[k]
		require.False(t, dup, "%v collides with %s", parts, prev)
		seen[k] = strings.Join(parts[:], "/")
	}
}

func TestDeriveRefusesBadParts(t *testing.T) {
	t.Parallel()
	for _, parts := range [][3]string{
		{"", "e-1", "s"},
		{"c", "", "s"},
		{"c", "e-1", ""},
		{"c", "\xff", "s"},
		{"c", strings.Repeat("x", idemkey.MaxPartLength+1), "s"},
	} {
		_, err := idemkey.Derive(parts[0], parts[1], parts[2])
		require.ErrorIs(t, err, idemkey.ErrInvalidPart, "%q", parts)
		_, err = idemkey.DeriveUUID(parts[0], parts[1], parts[2])
		require.ErrorIs(t, err, idemkey.ErrInvalidPart, "%q", parts)
	}
	_, err := idemkey.Derive("", "", "")
	require.ErrorContains(t, err, "consumer is empty")
	require.ErrorContains(t, err, "message id is empty")
	require.ErrorContains(t, err, "step is empty")
}

func TestDeriveUUIDShape(t *testing.T) {
	t.Parallel()
	u, err := idemkey.DeriveUUID("rewards", "e-91", "charge")
	require.NoError(t, err)
	require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`), u)
	hexKey, _ := idemkey.Derive("rewards", "e-91", "charge")
	require.Equal(t, hexKey[:8], u[:8], "the UUID is the same hash, formatted")
	again, _ := idemkey.DeriveUUID("rewards", "e-91", "charge")
	require.Equal(t, u, again)
	other, _ := idemkey.DeriveUUID("rewards", "e-91", "receipt")
	require.NotEqual(t, u, other)
}

func TestSource(t *testing.T) {
	t.Parallel()
	msg := message.NewMessage("uuid-1", []byte("p"))
	msg.Metadata.Set("event_id", "evt-7")

	_, err := idemkey.ForMessage(msg, "charge")
	require.ErrorIs(t, err, idemkey.ErrInvalidPart, "outside a router there is no handler name")
	require.ErrorContains(t, err, "set Source.Consumer")

	src := idemkey.Source{Consumer: "rewards"}
	k, err := src.Key(msg, "charge")
	require.NoError(t, err)
	want, _ := idemkey.Derive("rewards", "uuid-1", "charge")
	require.Equal(t, want, k)

	byEvent := idemkey.Source{Consumer: "rewards", MessageID: func(m *message.Message) (string, error) {
		return m.Metadata.Get("event_id"), nil
	}}
	k, err = byEvent.Key(msg, "charge")
	require.NoError(t, err)
	want, _ = idemkey.Derive("rewards", "evt-7", "charge")
	require.Equal(t, want, k)

	_, err = byEvent.Key(message.NewMessage("uuid-2", nil), "charge")
	require.ErrorContains(t, err, "empty id")
	_, err = src.Key(msg, "")
	require.ErrorContains(t, err, "step is empty")
}
