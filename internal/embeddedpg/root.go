package embeddedpg

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// As root, initdb and postgres refuse to run. The server is then run by a copy of this very
// binary (os.Executable, started with envChild set) that drops to an unprivileged user in
// init, before any other package's code runs in it, and starts the server as that user. The
// copy starts as root, so it can read the binary wherever it is (`go run` keeps it in a
// directory only root can read) and then holds nothing of root's.
//
// The parent and the copy talk through the copy's stdin and stdout: the copy writes one JSON
// line (childReport) once the server runs or failed to start, and stops the server and removes
// its directory when its stdin closes: when the parent calls Stop, and when the parent exits,
// however it exits.

// envChild carries the copy's childSpec. Set only by startAsChild.
const envChild = "WMONCE_EMBEDDEDPG_CHILD"

type childSpec struct {
	Dir  string `json:"dir"` // owned by UID: the cache copy in Dir/cache, the server in Dir/pg
	Port int    `json:"port"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
}

type childReport struct {
	Error string `json:"error,omitempty"`
}

func init() {
	if spec := os.Getenv(envChild); spec != "" {
		os.Exit(runAsChild(spec))
	}
}

// runAsChild is the copy's whole life: drop to the user, start the server, wait for stdin to
// close, stop the server. It returns the exit code.
func runAsChild(spec string) int {
	report := func(r childReport) {
		b, _ := json.Marshal(r)
		fmt.Fprintf(os.Stdout, "%s\n", b)
	}
	var c childSpec
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		report(childReport{Error: fmt.Sprintf("embeddedpg: %s: %v", envChild, err)})
		return 1
	}
	_ = os.Unsetenv(envChild)
	// The parent's stdin closing is the one stop signal: Ctrl-C in a terminal reaches the whole
	// process group, and the server must be stopped, not left running.
	signal.Ignore(os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	if err := errors.Join(syscall.Setgroups(nil), syscall.Setgid(c.GID), syscall.Setuid(c.UID)); err != nil {
		report(childReport{Error: fmt.Sprintf("embeddedpg: drop to uid %d gid %d: %v", c.UID, c.GID, err)})
		return 1
	}
	_ = os.Setenv("TMPDIR", c.Dir) // the library's log file goes there, and with the directory
	s, err := startIn(Config{CacheDir: filepath.Join(c.Dir, "cache"), Port: c.Port, Log: os.Stderr}, filepath.Join(c.Dir, "pg"))
	if err != nil {
		report(childReport{Error: err.Error()})
		return 1
	}
	report(childReport{})
	_, _ = io.Copy(io.Discard, os.Stdin)
	// The whole directory, the lent archive too: the parent may be gone (killed) and cannot.
	if err := errors.Join(s.Stop(), os.RemoveAll(c.Dir)); err != nil {
		fmt.Fprintf(os.Stderr, "embeddedpg: stop the embedded PostgreSQL: %v\n", err)
		return 1
	}
	return 0
}

// startAsChild starts the server through a copy of this binary running as config.RunAs.
func startAsChild(config Config) (*Server, error) {
	name := cmp.Or(config.RunAs, DefaultRunAs)
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w: it runs as an unprivileged user, and %w: create one (`useradd --system %s`) or name another with %s", ErrRoot, err, name, EnvRunAs)
	}
	uid, errU := strconv.Atoi(u.Uid)
	gid, errG := strconv.Atoi(u.Gid)
	if errU != nil || errG != nil || uid == 0 {
		return nil, fmt.Errorf("%w: user %q (uid %s) is not an unprivileged user: name another with %s", ErrRoot, name, u.Uid, EnvRunAs)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("embedded PostgreSQL: find this binary to run the server as %s: %w", name, err)
	}
	dir, err := os.MkdirTemp("", "wmonce-embeddedpg-")
	if err != nil {
		return nil, fmt.Errorf("embedded PostgreSQL: runtime directory: %w", err)
	}
	fail := func(err error) (*Server, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	// The user cannot read root's cache: it gets its own copy of the archive, and one it
	// downloads is copied back below.
	lent := filepath.Join(dir, "cache")
	if err := os.Mkdir(lent, 0o700); err != nil {
		return fail(fmt.Errorf("embedded PostgreSQL: %w", err))
	}
	archives, _ := filepath.Glob(filepath.Join(config.CacheDir, "embedded-postgres-binaries-*-"+string(Version)+".txz"))
	for _, a := range archives {
		if err := copyFile(a, filepath.Join(lent, filepath.Base(a))); err != nil {
			return fail(fmt.Errorf("embedded PostgreSQL: lend the binaries archive to %s: %w", name, err))
		}
	}
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		return errors.Join(err, os.Lchown(p, uid, gid))
	}); err != nil {
		return fail(fmt.Errorf("embedded PostgreSQL: give %s its directory: %w", name, err))
	}
	spec, _ := json.Marshal(childSpec{Dir: dir, Port: config.Port, UID: uid, GID: gid})
	// Not CommandContext: the copy must outlive any context of Start's caller, until Stop or
	// this process's exit closes its stdin.
	cmd := exec.Command(exe) //nolint:noctx // see above
	cmd.Env = append(os.Environ(), envChild+"="+string(spec))
	if config.Log != io.Discard {
		cmd.Stderr = config.Log
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fail(fmt.Errorf("embedded PostgreSQL: %w", err))
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fail(fmt.Errorf("embedded PostgreSQL: %w", err))
	}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("embedded PostgreSQL: start a copy of %s to run the server as %s: %w", exe, name, err))
	}
	line, readErr := bufio.NewReader(stdout).ReadBytes('\n')
	var rep childReport
	if readErr == nil {
		readErr = json.Unmarshal(line, &rep)
	}
	if readErr != nil || rep.Error != "" {
		_ = stdin.Close()
		waitErr := cmd.Wait()
		if readErr != nil {
			return fail(fmt.Errorf("embedded PostgreSQL: the copy running the server as %s ended without a word (%w; %w)", name, readErr, waitErr))
		}
		return fail(fmt.Errorf("embedded PostgreSQL (as %s): %s", name, rep.Error))
	}
	if len(archives) == 0 { // downloaded by the copy: keep it for the next run
		got, _ := filepath.Glob(filepath.Join(lent, "embedded-postgres-binaries-*-"+string(Version)+".txz"))
		for _, a := range got {
			_ = copyFile(a, filepath.Join(config.CacheDir, filepath.Base(a)))
		}
	}
	return &Server{dir: dir, port: config.Port, child: cmd, stdin: stdin, runAs: name}, nil
}

// stopChild closes the copy's stdin, which stops the server, waits for it to exit and removes
// what it left of the directory.
func (s *Server) stopChild() error {
	err := errors.Join(s.stdin.Close(), s.child.Wait())
	return errors.Join(err, os.RemoveAll(s.dir))
}

// copyFile copies from to to through a temporary name, so that an interrupted copy never
// looks like a complete archive.
func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := to + ".part"
	dst, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, src)
	if err = errors.Join(err, dst.Close()); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, to)
}
