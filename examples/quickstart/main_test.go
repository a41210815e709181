package main

import (
	"context"
	"testing"

	"github.com/wmonce/watermill-once/internal/pgtest"
)

// The quickstart is the README's first code; running it here keeps it working.
func TestQuickstartRuns(t *testing.T) {
	pgtest.SkipShort(t)
	if err := run(context.Background()); err != nil {
		t.Fatalf("%v (the quickstart needs PostgreSQL: start it or set DATABASE_URL)", err)
	}
}
