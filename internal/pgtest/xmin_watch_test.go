package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// failedTest stands for a test that failed: it keeps the cleanups and the log lines.
type failedTest struct {
	testing.TB
	cleanups []func()
	logs     []string
}

func (f *failedTest) Helper()           {}
func (f *failedTest) Failed() bool      { return true }
func (f *failedTest) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *failedTest) Logf(format string, a ...any) {
	f.logs = append(f.logs, fmt.Sprintf(format, a...))
}

// TestWatchOldTransactionsNamesTheHolder: a transaction that holds a transaction ID is named,
// with its last statement, when the watching test fails.
func TestWatchOldTransactionsNamesTheHolder(t *testing.T) {
	db := DB(t)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var pid int
	if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid() WHERE pg_current_xact_id() IS NOT NULL`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	f := &failedTest{TB: t}
	WatchOldTransactions(f, 0)
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	out := strings.Join(f.logs, "\n")
	if !strings.Contains(out, fmt.Sprintf("pid %d ", pid)) || !strings.Contains(out, "pg_current_xact_id") {
		t.Fatalf("the watch did not name backend %d and its statement:\n%s", pid, out)
	}
}
