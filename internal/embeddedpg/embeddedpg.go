// Package embeddedpg finds PostgreSQL for the examples, starting one when there is none, so
// that `go run ./examples/payments` works on a machine with nothing installed but Go.
//
// DatabaseURL decides, in this order:
//
//  1. DATABASE_URL when it is set;
//  2. the local default (pgtx.DefaultDatabaseURL) when something answers on the probe address
//     (127.0.0.1:5432, or EnvProbeAddr);
//  3. otherwise an embedded PostgreSQL (github.com/fergusstrange/embedded-postgres), announced
//     on Options.Out. Its server binaries are downloaded once (tens of MB) into the user's
//     cache directory (<os.UserCacheDir>/wmonce/embedded-postgres, or EnvCacheDir) and reused;
//     each run extracts them into a temporary directory that also holds the data directory,
//     and stop removes it. The server listens on the probe port when that is free, else on a
//     free port.
//
// As root (the default user of Docker containers and CI machines), where initdb and postgres
// refuse to run, the server runs as an unprivileged user: nobody (or EnvRunAs). The process
// starts a copy of its own binary that drops to that user before it does anything else (see
// runAsChild) and runs the server from a temporary directory owned by that user, with a
// private copy of the cached binaries archive; an archive it downloaded is kept in root's
// cache. The copy stops the server and removes its directory when its parent stops it, or
// exits (its stdin closes).
//
// Where it stops: a process killed without running stop (SIGKILL) leaves its server running
// and its temporary directory behind, except as root, where the copy sees its stdin close,
// stops the server and removes the directory (checked by hand: SIGKILL of the parent left no
// server and no directory).
package embeddedpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	embeddedpostgres "github.com/fergusstrange/embedded-postgres"

	"github.com/wmonce/watermill-once/pgtx"
)

const (
	// EnvDatabaseURL is read first; when set, nothing is probed or started.
	EnvDatabaseURL = "DATABASE_URL"
	// EnvProbeAddr is where a running PostgreSQL is looked for (host:port). Default
	// DefaultProbeAddr. A server answering there is used as
	// postgres://postgres@<addr>/test?sslmode=disable.
	EnvProbeAddr = "WMONCE_PG_PROBE_ADDR"
	// EnvCacheDir overrides the directory that keeps the downloaded server binaries.
	EnvCacheDir = "WMONCE_PG_CACHE_DIR"
	// EnvRunAs names the unprivileged user the server runs as when the process runs as root.
	// Default DefaultRunAs.
	EnvRunAs = "WMONCE_PG_RUN_AS"

	// DefaultRunAs is the user the server runs as under root.
	DefaultRunAs = "nobody"

	// DefaultProbeAddr is the host and port of pgtx.DefaultDatabaseURL.
	DefaultProbeAddr = "127.0.0.1:5432"
	// Version is the PostgreSQL version started.
	Version = embeddedpostgres.V18
)

// ErrRoot is wrapped by the error of a start as root that found no unprivileged user to run
// the server as.
var ErrRoot = errors.New("embeddedpg: embedded PostgreSQL cannot run as root (initdb and postgres refuse to)")

// Options configure DatabaseURL.
type Options struct {
	// Getenv reads the environment. Default os.Getenv.
	Getenv func(string) string
	// Out receives one-line announcements (what was found or started). Default: discarded.
	Out io.Writer
	// Log receives the embedded server's own log. Default: discarded.
	Log io.Writer
}

// DatabaseURL returns the URL of the PostgreSQL the examples should use and a function to call
// at exit (never nil): it stops the embedded server, if one was started, and removes its data.
func DatabaseURL(ctx context.Context, opts Options) (dbURL string, stop func() error, err error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	nop := func() error { return nil }
	if v := getenv(EnvDatabaseURL); v != "" {
		return v, nop, nil
	}
	probe := getenv(EnvProbeAddr)
	if probe == "" {
		probe = DefaultProbeAddr
	}
	host, port, err := net.SplitHostPort(probe)
	if err != nil {
		return "", nop, fmt.Errorf("%s=%q: want host:port: %w", EnvProbeAddr, probe, err)
	}
	if answers(ctx, probe) {
		u, _ := url.Parse(pgtx.DefaultDatabaseURL)
		u.Host = probe
		return u.String(), nop, nil
	}
	cacheDir := getenv(EnvCacheDir)
	if cacheDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return "", nop, fmt.Errorf("embedded PostgreSQL: no cache directory (set %s): %w", EnvCacheDir, err)
		}
		cacheDir = filepath.Join(base, "wmonce", "embedded-postgres")
	}
	p, _ := strconv.Atoi(port)
	// As root the server runs as an unprivileged user, who cannot listen on a port below 1024.
	if p <= 0 || (p < 1024 && os.Geteuid() == 0) || !free(ctx, host, p) {
		if p, err = freePort(ctx); err != nil {
			return "", nop, err
		}
	}
	if !cached(cacheDir) {
		fmt.Fprintf(out, "==> downloading the PostgreSQL %s server binaries (tens of MB, once) into %s\n", Version, cacheDir)
	}
	s, err := Start(Config{CacheDir: cacheDir, Port: p, Log: opts.Log, RunAs: getenv(EnvRunAs)})
	if err != nil {
		return "", nop, err
	}
	as := ""
	if s.child != nil {
		as = ", running as " + s.runAs + " because this process runs as root"
	}
	fmt.Fprintf(out, "==> %s is not set and nothing answers on %s: started an embedded PostgreSQL %s on 127.0.0.1:%d (data in %s, removed at exit%s)\n",
		EnvDatabaseURL, probe, Version, p, s.dir, as)
	return s.URL(), s.Stop, nil
}

// Config configures Start.
type Config struct {
	// CacheDir keeps the downloaded binaries archive. Required.
	CacheDir string
	// Port to listen on (127.0.0.1 and localhost). Required.
	Port int
	// Log receives the server's log. Default: discarded.
	Log io.Writer
	// RunAs is the unprivileged user the server runs as when this process runs as root.
	// Default DefaultRunAs.
	RunAs string
}

// Server is a running embedded PostgreSQL.
type Server struct {
	ep      *embeddedpostgres.EmbeddedPostgres
	dir     string
	port    int
	logFile string

	child *exec.Cmd      // as root: the copy of this binary that runs the server as runAs
	stdin io.WriteCloser // closing it tells the child to stop
	runAs string
}

// Start extracts the server into a new temporary directory, initialises a data directory there
// and starts the server. As root the server runs as config.RunAs (see the package doc).
func Start(config Config) (*Server, error) {
	if config.CacheDir == "" || config.Port <= 0 {
		return nil, errors.New("embeddedpg: CacheDir and Port are required")
	}
	if config.Log == nil {
		config.Log = io.Discard
	}
	if err := os.MkdirAll(config.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded PostgreSQL: cache directory: %w", err)
	}
	if os.Geteuid() == 0 {
		return startAsChild(config)
	}
	dir, err := os.MkdirTemp("", "wmonce-embeddedpg-")
	if err != nil {
		return nil, fmt.Errorf("embedded PostgreSQL: runtime directory: %w", err)
	}
	return startIn(config, dir)
}

// startIn starts the server in dir, which it removes on failure.
func startIn(config Config, dir string) (*Server, error) {
	ep := embeddedpostgres.NewDatabase(embeddedpostgres.DefaultConfig().
		Version(Version).
		Port(uint32(config.Port)).
		CachePath(config.CacheDir).
		RuntimePath(dir).
		Locale("C").
		Encoding("UTF8").
		StartTimeout(2 * time.Minute).
		Logger(config.Log))
	before := libraryLogs()
	err := ep.Start()
	logFile := ownLog(before, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		if logFile != "" {
			_ = os.Remove(logFile)
		}
		return nil, fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	return &Server{ep: ep, dir: dir, port: config.Port, logFile: logFile}, nil
}

// The library copies the server's log to Config.Log through a file it creates in os.TempDir()
// and never removes; libraryLogs and ownLog find ours (initdb writes our data directory's path
// into it) so that Stop can remove it.
const libraryLogPattern = "embedded_postgres_log*"

func libraryLogs() map[string]bool {
	m, _ := filepath.Glob(filepath.Join(os.TempDir(), libraryLogPattern))
	seen := make(map[string]bool, len(m))
	for _, f := range m {
		seen[f] = true
	}
	return seen
}

func ownLog(before map[string]bool, dir string) string {
	m, _ := filepath.Glob(filepath.Join(os.TempDir(), libraryLogPattern))
	for _, f := range m {
		if before[f] {
			continue
		}
		if b, err := os.ReadFile(f); err == nil && bytes.Contains(b, []byte(dir)) {
			return f
		}
	}
	return ""
}

// URL is the server's database URL (user and password postgres, database postgres).
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Stop stops the server and removes its directory (binaries and data).
func (s *Server) Stop() error {
	if s.child != nil {
		return s.stopChild()
	}
	err := errors.Join(s.ep.Stop(), os.RemoveAll(s.dir))
	if s.logFile != "" {
		err = errors.Join(err, os.Remove(s.logFile))
	}
	return err
}

// answers reports whether something accepts TCP connections on addr.
func answers(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// free reports whether port can be listened on at host and at localhost (the embedded server
// listens on localhost).
func free(ctx context.Context, host string, port int) bool {
	for _, h := range []string{host, "localhost"} {
		l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", net.JoinHostPort(h, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}

func freePort(ctx context.Context) (int, error) {
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("embedded PostgreSQL: no free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// cached reports whether the binaries archive of Version is already in dir.
func cached(dir string) bool {
	m, _ := filepath.Glob(filepath.Join(dir, "embedded-postgres-binaries-*-"+string(Version)+".txz"))
	return len(m) > 0
}
