package main

import (
	"context"
	"testing"
)

// The quickstart is the README's first code; running it here keeps it working.
func TestQuickstartRuns(t *testing.T) {
	if err := run(context.Background()); err != nil {
		t.Fatalf("%v (the quickstart needs PostgreSQL: start it or set DATABASE_URL)", err)
	}
}
