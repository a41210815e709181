package restore_test

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/outboxops"
)

// buildCLI builds the wmonce command into dir: the test recovers with the documented command.
func buildCLI(ctx context.Context, t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "wmonce")
	// Built in the library's module, with its own go.mod (as a user gets it): this module's
	// go.sum need not hold the CLI's requirements.
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/wmonce")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/wmonce: %s", out)
	return bin
}

// wmonce runs the CLI against the database at url and returns its output; it fails t unless the
// command exits 0.
func wmonce(ctx context.Context, t *testing.T, bin, url string, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, bin, append([]string{"-database-url", url}, args...)...).CombinedOutput()
	require.NoError(t, err, "wmonce %v: %s", args, out)
	return string(out)
}

// wmonceFails runs the CLI like wmonce and returns its output; it fails t unless the command
// exits 1 (doctor's verdict on a finding).
func wmonceFails(ctx context.Context, t *testing.T, bin, url string, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, bin, append([]string{"-database-url", url}, args...)...).CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "wmonce %v: %s", args, out)
	require.Equal(t, 1, exit.ExitCode(), "wmonce %v: %s", args, out)
	return string(out)
}

// checkOutbox returns the outbox's position check (outboxops.CheckPositions).
func checkOutbox(ctx context.Context, t *testing.T, db *sql.DB, schema string) error {
	t.Helper()
	r, err := outboxops.CheckPositions(ctx, db, schema)
	require.NoError(t, err)
	return r.Err()
}
