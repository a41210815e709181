package embeddedpg

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/pgtx"
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

// As root (CI, Docker), with nothing on the probe port, the embedded server runs as nobody:
// it answers, its data directory belongs to nobody, and stop stops it and removes its
// directory. The binaries archive is the one in root's cache (downloaded on the first run).
func TestDatabaseURLAsRootRunsTheServerAsNobody(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded PostgreSQL: skipped under -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("runs only as root (as CI does): as any other user examples/payments tests the embedded start")
	}
	nobody, err := user.Lookup("nobody")
	require.NoError(t, err, "the test needs the user nobody")
	cacheDir, err := os.UserCacheDir()
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	var out bytes.Buffer
	ctx := context.Background()
	url, stop, err := DatabaseURL(ctx, Options{Out: &out, Getenv: env(map[string]string{
		EnvProbeAddr: addr, EnvCacheDir: filepath.Join(cacheDir, "wmonce", "embedded-postgres"),
	})})
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = stop()
		}
	})
	require.Contains(t, out.String(), "nothing answers on "+addr+": started an embedded PostgreSQL")
	require.Contains(t, out.String(), "running as nobody because this process runs as root")

	db, err := pgtx.Open(ctx, url, pgtx.PoolConfig{})
	require.NoError(t, err)
	var dataDir, role string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT current_setting('data_directory'), current_user`).Scan(&dataDir, &role))
	require.NoError(t, db.Close())
	require.Equal(t, "postgres", role)
	st, err := os.Stat(dataDir)
	require.NoError(t, err)
	require.Equal(t, nobody.Uid, strconv.Itoa(int(st.Sys().(*syscall.Stat_t).Uid)), "the data directory belongs to nobody")

	stopped = true
	require.NoError(t, stop())
	_, err = os.Stat(dataDir)
	require.True(t, os.IsNotExist(err), "stop removes the server's directory: %v", err)
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		_ = c.Close()
	}
	require.Error(t, err, "the server is stopped")
}
