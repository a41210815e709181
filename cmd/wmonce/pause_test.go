package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/operate"
)

// `wmonce pause` and `wmonce resume` pause an inbox consumer and a relay in the database,
// `wmonce status` shows it, and a second pause says so; mistakes are usage errors.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	r := runCLI(t, f.schema, "pause", "-consumer", "billing")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `paused inbox consumer "billing"`)
	require.Equal(t, 1, pgtestCount(t, f, `SELECT count(*) FROM `+f.table("inbox_paused")+` WHERE consumer = 'billing'`))
	r = runCLI(t, f.schema, "pause", "-consumer", "billing")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `inbox consumer "billing" was paused already`)

	r = runCLI(t, f.schema, "-json", "pause", "-relay", "sms")
	require.Equal(t, exitOK, r.code, r.stderr)
	var res operate.PauseResponse
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res))
	require.Equal(t, operate.PauseResponse{Relay: "sms", Paused: true, Changed: true}, res)

	r = runCLI(t, f.schema, "status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "inbox consumer billing is paused since")
	require.Contains(t, r.stdout, "relay sms is paused since")

	r = runCLI(t, f.schema, "resume", "-consumer", "billing")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `resumed inbox consumer "billing"`)
	r = runCLI(t, f.schema, "resume", "-relay", "sms")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `resumed relay "sms"`)
	require.Zero(t, pgtestCount(t, f, `SELECT count(*) FROM `+f.table("outbox_offsets")+` WHERE paused_at IS NOT NULL`))
	r = runCLI(t, f.schema, "status")
	require.NotContains(t, r.stdout, "paused since")

	r = runCLI(t, f.schema, "pause", "-relay", "nope")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "no relay of that name has run in this schema")
	for _, args := range [][]string{{"pause"}, {"resume", "-consumer", "billing", "-relay", "sms"}} {
		r := runCLI(t, f.schema, args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, "give -consumer or -relay", "%v", args)
	}
}

func pgtestCount(t *testing.T, f *fixture, query string) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow(query).Scan(&n))
	return n
}
