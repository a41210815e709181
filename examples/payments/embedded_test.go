package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
// initdb refuses to run as root, so as root the binary runs as nobody; the binaries archive is
// kept in this user's cache directory (downloaded on the first run, tens of MB) and lent to
// nobody through a directory of its own. As root the test also checks the refusal message.
func TestDemoWithoutPostgreSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded PostgreSQL (its binaries downloaded on the first run): skipped under -short")
	}
	t.Parallel()
	work, err := os.MkdirTemp("", "wmonce-demo-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(work) })
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
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		stdout, stderr, err := runBinary(bin, work, nil, env)
		require.Error(t, err, "as root the demo must refuse, not start a server: %s", stdout)
		for _, want := range []string{"initdb refuses to run as root", "Run as a regular user", "make services", "docker compose up -d postgres", "DATABASE_URL"} {
			require.Contains(t, stderr, want)
		}
		cred = lendToNobody(t, work, fixedCache, env)
	}

	stdout, stderr, err := runBinary(bin, work, cred, env)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Contains(t, stdout, "DATABASE_URL is not set and nothing answers on "+probe+": started an embedded PostgreSQL")
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

// runBinary runs the demo binary in dir with env (and nothing else) as cred (nil: this user).
func runBinary(bin, dir string, cred *syscall.Credential, env []string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // the first run downloads
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// lendToNobody prepares work for a run as the user nobody, whose credential it returns:
// nobody cannot read root's cache, so it gets a copy of the archives in a directory of its own
// (the last entry of env is pointed there), and what it downloads is kept in root's cache when
// the test ends.
func lendToNobody(t *testing.T, work, fixedCache string, env []string) *syscall.Credential {
	t.Helper()
	nobody, err := user.Lookup("nobody")
	require.NoError(t, err, "running the demo as an unprivileged user needs the user nobody")
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	lent := filepath.Join(work, "cache")
	require.NoError(t, os.Mkdir(lent, 0o755))
	archives, _ := filepath.Glob(filepath.Join(fixedCache, "*.txz"))
	for _, a := range archives {
		copyFile(t, a, filepath.Join(lent, filepath.Base(a)))
	}
	t.Cleanup(func() {
		got, _ := filepath.Glob(filepath.Join(lent, "*.txz"))
		for _, a := range got {
			if _, err := os.Stat(filepath.Join(fixedCache, filepath.Base(a))); os.IsNotExist(err) {
				copyFile(t, a, filepath.Join(fixedCache, filepath.Base(a)))
			}
		}
	})
	env[len(env)-1] = embeddedpg.EnvCacheDir + "=" + lent
	require.NoError(t, filepath.Walk(work, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	}))
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	require.NoError(t, err)
	defer src.Close()
	tmp := to + ".part"
	dst, err := os.Create(tmp)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, errors.Join(err, dst.Close()))
	require.NoError(t, os.Rename(tmp, to))
}
