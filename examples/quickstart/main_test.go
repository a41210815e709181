package main

import (
	"context"
	"os"
	"strings"
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

// The README's Quick start is rewards.go, character for character, so that what a reader
// copies compiles and is the code TestQuickstartRuns runs.
func TestReadmeQuickStartIsRewardsGo(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("rewards.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Quick start\n")
	if !ok {
		t.Fatal(`README.md has no "## Quick start" section`)
	}
	_, block, ok := strings.Cut(section, "```go\n")
	if !ok {
		t.Fatal("the README's Quick start has no ```go block")
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("the README's Quick start code block is not closed")
	}
	if block+"\n" != string(want) {
		t.Fatalf("the README's Quick start differs from examples/quickstart/rewards.go: copy the file into the README's ```go block.\nREADME:\n%s", block)
	}
}
