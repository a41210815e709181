package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/wmonce/watermill-once/pgtx"
)

func printHelp(w io.Writer) {
	fmt.Fprint(w, `wmonce: operate watermill-once (effectively-once message handling on PostgreSQL)

Usage:
  wmonce [-database-url URL] [-schema NAME] [-json] <command> [flags]

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	fmt.Fprintf(tw, "  help [command]\texplain a command, with examples\n")
	_ = tw.Flush()
	fmt.Fprintf(w, `
Global flags (before or after the command):
  -database-url URL  PostgreSQL to use. Default: $DATABASE_URL, else
                     %s
  -schema NAME       schema holding watermill-once's tables (default %s)
  -json              machine-readable output

Exit codes: 0 success, 1 failure (the message says what to fix), 2 usage error, 3 (doctor)
no hazard found but a source could not be checked.

Examples:
  wmonce migrate up
  wmonce status
  wmonce inbox list -consumer rewards -status FAILED
  wmonce inbox replay -consumer rewards -dry-run
  wmonce dedupe -consumer rewards -message 5f0c0d5e-...
  wmonce -json outbox
`, pgtx.DefaultDatabaseURL, pgtx.DefaultSchema)
}

func printCommandHelp(w io.Writer, c *command) {
	fmt.Fprintf(w, "wmonce %s: %s\n\nUsage:\n", c.name, c.summary)
	for _, line := range strings.Split(strings.TrimSpace(c.usage), "\n") {
		fmt.Fprintf(w, "  wmonce %s\n", strings.TrimSpace(line))
	}
	if c.details != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.details))
	}
	if len(c.examples) > 0 {
		fmt.Fprintf(w, "\nExamples:\n")
		for _, ex := range c.examples {
			fmt.Fprintf(w, "  %s\n", ex)
		}
	}
	fmt.Fprintf(w, "\nGlobal flags -database-url, -schema and -json work here too (see `wmonce help`).\n")
}

// suggest returns ` (did you mean "x"?)` for a near miss.
func suggest(name string) string {
	best, bestDist := "", 3
	for _, c := range append(commands(), &command{name: "help"}) {
		if d := editDistance(name, c.name); d < bestDist {
			best, bestDist = c.name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
