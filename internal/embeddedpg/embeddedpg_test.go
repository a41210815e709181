package embeddedpg

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestDatabaseURLPrefersDatabaseURL(t *testing.T) {
	url, stop, err := DatabaseURL(context.Background(), Options{Getenv: env(map[string]string{
		EnvDatabaseURL: "postgres://elsewhere/db", EnvProbeAddr: "not an address",
	})})
	require.NoError(t, err)
	require.NoError(t, stop())
	require.Equal(t, "postgres://elsewhere/db", url, "DATABASE_URL wins; nothing is probed or started")
}

// A server answering on the probe address is used as it is, under the default URL's user and
// database.
func TestDatabaseURLUsesTheServerThatAnswers(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	url, stop, err := DatabaseURL(context.Background(), Options{Getenv: env(map[string]string{EnvProbeAddr: l.Addr().String()})})
	require.NoError(t, err)
	require.NoError(t, stop())
	require.Equal(t, "postgres://postgres@"+l.Addr().String()+"/test?sslmode=disable", url)
}

func TestDatabaseURLRefusesABadProbeAddress(t *testing.T) {
	_, _, err := DatabaseURL(context.Background(), Options{Getenv: env(map[string]string{EnvProbeAddr: "5432"})})
	require.ErrorContains(t, err, EnvProbeAddr+`="5432": want host:port`)
}

// As root nothing is started: initdb would refuse, so the error says what to do instead. (The
// embedded start itself is tested by examples/payments, which runs the demo as nobody.)
func TestDatabaseURLAsRootSaysWhatToDo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs only as root: as any other user the embedded start is tested by examples/payments")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	_, stop, err := DatabaseURL(context.Background(), Options{Getenv: env(map[string]string{EnvProbeAddr: addr})})
	require.NoError(t, stop())
	require.True(t, errors.Is(err, ErrRoot), "%v", err)
	for _, want := range []string{"nothing answers on " + addr, "initdb refuses to run as root", "regular user", "make services", "docker compose up -d postgres", "set DATABASE_URL"} {
		require.ErrorContains(t, err, want)
	}
}
