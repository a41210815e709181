package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/embeddedpg"
)

// TestDemoWithoutPostgreSQL runs the demo binary as a user would on a machine with nothing
// installed but Go: DATABASE_URL unset and nothing answering where PostgreSQL is looked for
// (a free port stands in for 127.0.0.1:5432, which the test server occupies). The demo must
// start an embedded PostgreSQL, say so, finish with the usual figures, and remove the server's
// directory at exit.
//
// As root (CI, Docker) the demo runs as root too: embeddedpg runs the server as nobody. The
// binaries archive is kept in this user's cache directory (downloaded on the first run, tens
// of MB).
func TestDemoWithoutPostgreSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded PostgreSQL (its binaries downloaded on the first run): skipped under -short")
	}
	t.Parallel()
	work, err := os.MkdirTemp("", "wmonce-demo-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(work) })
	require.NoError(t, os.Chmod(work, 0o755)) // as root, nobody reaches the server's directory through it
	bin := filepath.Join(work, "payments")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	userCache, err := os.UserCacheDir()
	require.NoError(t, err)
	fixedCache := filepath.Join(userCache, "wmonce", "embedded-postgres")
	require.NoError(t, os.MkdirAll(fixedCache, 0o755))

	tmp := filepath.Join(work, "tmp") // the demo's TMPDIR: its server directory goes here
	require.NoError(t, os.Mkdir(tmp, 0o755))
	probe := freeAddr(t)
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + work,
		"TMPDIR=" + tmp,
		embeddedpg.EnvProbeAddr + "=" + probe,
		embeddedpg.EnvCacheDir + "=" + fixedCache,
	}
	stdout, stderr, err := runBinary(bin, work, env)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Contains(t, stdout, "DATABASE_URL is not set and nothing answers on "+probe+": started an embedded PostgreSQL")
	if os.Geteuid() == 0 {
		require.Contains(t, stdout, "running as nobody because this process runs as root")
	}
	var res Result
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), "the last line is the JSON result:\n%s", stdout)
	require.Equal(t, Result{Broker: "sql", Deliveries: 3, Applied: 1, CashbackPaise: 2400, SMSSent: 1}, res)

	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, left, "the embedded server's directory (binaries and data) is removed at exit")
	c, err := net.DialTimeout("tcp", probe, time.Second)
	if err == nil {
		_ = c.Close()
	}
	require.Error(t, err, "the embedded server was stopped at exit")
}

// runBinary runs the demo binary in dir with env (and nothing else).
func runBinary(bin, dir string, env []string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // the first run downloads
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Dir = dir
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}
