// Package pgtest gives tests a real PostgreSQL: one pool per test binary and a fresh, migrated
// schema per test, so packages and tests run in parallel without seeing each other's rows.
package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/pgtx"
)

// URL is DATABASE_URL, or the local default.
func URL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return pgtx.DefaultDatabaseURL
}

var (
	sharedOnce sync.Once
	sharedDB   *sql.DB
	sharedErr  error
)

// SkipShort skips t under -short: the test needs PostgreSQL, a service `go test -short` does not
// expect. Every helper here that hands out a database calls it, so a test that reaches PostgreSQL
// through pgtest needs nothing more. Without -short a missing server fails the test (see DB).
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL (DATABASE_URL, default " + pgtx.DefaultDatabaseURL + "): skipped under -short")
	}
}

// DB returns the test binary's shared pool. A test that cannot reach PostgreSQL fails, saying
// what to start; it never skips, except under -short (SkipShort).
func DB(t testing.TB) *sql.DB {
	t.Helper()
	SkipShort(t)
	sharedOnce.Do(func() {
		sharedDB, sharedErr = pgtx.Open(context.Background(), URL(), pgtx.PoolConfig{MaxOpenConns: 24})
	})
	if sharedErr != nil {
		t.Fatalf("%v\nThese tests need PostgreSQL. Start it (`pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, or `docker compose up -d postgres`) or point DATABASE_URL at one.", sharedErr)
	}
	return sharedDB
}

// OpenDB opens a pool of its own, closed when the test ends: for tests that need a pool size
// of their own or that break connections on purpose.
func OpenDB(t testing.TB, maxConns int) *sql.DB {
	t.Helper()
	SkipShort(t)
	db, err := pgtx.Open(context.Background(), URL(), pgtx.PoolConfig{MaxOpenConns: maxConns})
	if err != nil {
		t.Fatalf("%v\nStart PostgreSQL or set DATABASE_URL.", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Schema creates a uniquely named schema, applies every migration to it and drops it when the
// test ends (unless PGTEST_KEEP is set, for post-mortems).
func Schema(t testing.TB, db *sql.DB) string {
	t.Helper()
	SkipShort(t)
	name := NewName("t")
	ctx := context.Background()
	m, err := migrate.New(db, migrate.Config{Schema: name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		t.Fatalf("migrate schema %s: %v", name, err)
	}
	t.Cleanup(func() {
		if os.Getenv("PGTEST_KEEP") != "" {
			t.Logf("keeping schema %s", name)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, `DROP SCHEMA `+pgtx.QuoteIdentifier(name)+` CASCADE`); err != nil {
			t.Logf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// NewName returns prefix_ followed by random hex: a valid, unique identifier or topic name.
func NewName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return strings.ToLower(prefix) + "_" + hex.EncodeToString(b)
}

// Exec runs a statement and fails the test on error.
func Exec(t testing.TB, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("exec %q: %v", query, err)
	}
}

// Count returns the result of a single-integer query.
func Count(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("query %q: %v", query, err)
	}
	return n
}

// Main is a TestMain for packages whose runnable examples need PostgreSQL. An example cannot
// skip itself, so under -short (and unless -skip is given) Main skips every example with
// -skip '^Example', says so, and runs the rest: the tests skip themselves through DB and Schema.
func Main(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		if f := flag.Lookup("test.skip"); f != nil && f.Value.String() == "" {
			_ = f.Value.Set("^Example")
			fmt.Fprintln(os.Stderr, "pgtest: -short: skipping this package's examples, which need PostgreSQL")
		}
	}
	os.Exit(m.Run())
}

// OldTransactions describes the server's transactions that have been open for longer than age,
// for a failure message: watermill-sql's subscribers read only rows below the oldest running
// transaction on the whole server, so one of these, in any test binary, holds back every SQL
// subscription until it ends.
func OldTransactions(t testing.TB, age time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := DB(t).QueryContext(ctx, `SELECT pid, coalesce(application_name, ''), coalesce(state, ''), (now() - xact_start)::text,
		left(regexp_replace(coalesce(query, ''), '\s+', ' ', 'g'), 200)
		FROM pg_stat_activity WHERE xact_start < now() - $1::interval AND pid <> pg_backend_pid()
		ORDER BY xact_start`, fmt.Sprintf("%d milliseconds", age.Milliseconds()))
	if err != nil {
		return "transactions open longer than " + age.String() + ": cannot read pg_stat_activity: " + err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var pid int
		var app, state, query string
		var open string
		if err := rows.Scan(&pid, &app, &state, &open, &query); err != nil {
			return b.String() + err.Error()
		}
		fmt.Fprintf(&b, "\n  pid %d (%s) %s, open %s: %s", pid, app, state, open, query)
	}
	if err := rows.Err(); err != nil {
		return b.String() + err.Error()
	}
	if b.Len() == 0 {
		return "no transaction open longer than " + age.String()
	}
	return "transactions open longer than " + age.String() + " (they hold back every SQL subscription on the server):" + b.String()
}
