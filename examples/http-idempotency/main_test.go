package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TestDemo runs the scripted client of -demo against the service on a fresh schema: every
// check it prints must pass.
func TestDemo(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	a, err := newApp(ctx, db, schema)
	require.NoError(t, err)
	t.Cleanup(a.Close)
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)

	var out bytes.Buffer
	err = runDemo(ctx, &out, srv.URL, a)
	t.Log(out.String())
	require.NoError(t, err)
	require.Contains(t, out.String(), "All checks passed.")
	require.NotContains(t, out.String(), "FAIL")
}
